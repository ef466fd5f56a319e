"""`modpipe model build` and `modpipe model eval`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from modpipe import log
from modpipe.settings import Settings

_log = log.get(__name__)

# PyTorch's OpenMP threads spin while waiting by default; on a busy 2-core machine (other processes running)
# that made a training step ~5x slower (measured 15-20 s vs 3-8 s per step). Passive waiting must be set
# before torch loads, i.e. here, when the command line is assembled.
if "torch" not in sys.modules:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def register(subparsers) -> None:
    model = subparsers.add_parser("model", help="build or evaluate the text model (ONNX)",
                                  description="Build (fine-tune + export) or evaluate the spam text model.")
    sub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)

    b = sub.add_parser(
        "build", help="fine-tune, export to ONNX, evaluate; cached by a key of code, config, data and base",
        description="Build the text model into $MODPIPE_CACHE_DIR/models/<key>/ and point models/current "
                    "(full) or models/current-demo (demo) at it. A complete build with the same key is reused.")
    b.add_argument("--profile", choices=("full", "gpu", "demo"), default=None,
                   help="full: the served CPU recipe, one epoch at 128 tokens (819 steps, ~15-25 min of training on 2 "
                        "cores); gpu: 512 tokens, trained embeddings, 4 epochs (minutes on a GPU; models/current-gpu); "
                        "demo: ~6 min, demo quality (default: $MODPIPE_MODEL_PROFILE, else full)")
    b.add_argument("--device", default="auto",
                   help="where training runs: auto (cuda if PyTorch sees a GPU, else cpu), cpu, cuda, cuda:N "
                        "(default auto; the device is part of the build key)")
    b.add_argument("--base", type=Path, default=None,
                   help="local BERT or DistilBERT checkpoint directory (config.json + weights + tokenizer.json "
                        "or vocab.txt) to fine-tune instead of the converted all-MiniLM-L6-v2")
    b.add_argument("--base-layers", type=int, default=0, metavar="N",
                   help="keep N evenly spaced layers of the base, first and last included (12 -> 6 keeps "
                        "0,2,4,7,9,11, as DistilBERT was initialised); 0 keeps all (default)")
    b.add_argument("--force", action="store_true", help="rebuild even if a build with the same key exists")
    b.add_argument("--reuse-any", action="store_true",
                   help="if any complete full build exists (models/current), use it; else build the profile asked")
    b.add_argument("--seed", type=int, default=0, help="seed of the split, the head and the training (default 0)")
    b.add_argument("--extra-data", type=Path, default=None, metavar="FILE",
                   help="fine-tune on the platform's own labelled texts too: JSONL, one {\"text\": ..., \"label\": "
                        "\"spam\"|\"ham\"} per line (`modpipe decision export-labels FILE` writes the moderators' "
                        "labels so); split, trained on and evaluated as the data set 'extra'; part of the build key")
    b.add_argument("--extra-repeat", type=int, default=None, metavar="N",
                   help="times each extra text is seen per epoch (default 3)")
    b.add_argument("--platforms", action=argparse.BooleanOptionalAction, default=None,
                   help="train on today's platform corpora too (YouTube, Instagram, X, SMS 2022, tweets, reviews; "
                        "modpipe/textmodel/platforms.py; read from MODPIPE_CORPORA_DIR or downloaded and checked), "
                        "each on its fixed split; the non-commercial ones (phishing e-mail, airline tweets) join the "
                        "test split only; part of the build key (default: on, in every profile; --no-platforms "
                        "builds the recipe without them)")
    b.add_argument("--leave-out", action="append", default=[], metavar="REGISTER",
                   help="train without this platform register (repeatable), scored on its test side: how the "
                        "model meets a register nobody collected")
    b.set_defaults(func=_build)

    e = sub.add_parser("eval", help="test-split metrics of the served ONNX model beside the TF-IDF+SVM baseline",
                       description="Evaluate a build's served model.onnx (ONNX Runtime) and a TF-IDF + LinearSVC "
                                   "baseline trained on the same train split, on each data set's test split.")
    e.add_argument("--json", action="store_true", help="print one JSON object (per-dataset entries)")
    e.add_argument("--model-dir", type=Path, default=None,
                   help="build directory (default: $MODPIPE_MODEL_DIR, else models/current, else current-demo)")
    e.add_argument("--robustness", action="store_true",
                   help="attack the test split with each obfuscation form (leet, look-alikes, spacing, invisible "
                        "characters, synonyms, punctuation) and report accuracy / spam F1 per form beside the "
                        "baseline, the gap to clean accuracy and the clean-ham false-positive rate")
    e.add_argument("--ood", action="store_true",
                   help="false positives on legitimate writing of kinds the build never saw (newsgroups, news, "
                        "reviews, tweets, editorials, speeches, TV dialogue, e-mail; read from packages of the PyPI, "
                        "npm and Debian registries) and recall on spam of another collection, per source beside "
                        "the baseline, and in-domain spam recall")
    e.add_argument("--platforms", action="store_true",
                   help="per register of today's platform corpora, on their fixed held-out (test) side: spam recall "
                        "and the share of legitimate texts flagged, the served model beside the TF-IDF + SVM "
                        "baseline trained on the build's own train split, against the targets")
    e.add_argument("--before", type=Path, default=None, metavar="DIR",
                   help="with --robustness or --ood: another build (e.g. the one served before) evaluated on the same "
                        "attacked texts, side by side")
    e.add_argument("--attack-seed", type=int, default=None, metavar="N",
                   help="seed of the attacks (default 1123; training's augmentation uses another seed stream)")
    e.add_argument("--attack-rate", type=float, default=None, metavar="R",
                   help="share of each text's words of >= 3 letters an attack rewrites (default 1.0: every word)")
    e.set_defaults(func=_eval)


def _build(args: argparse.Namespace) -> int:
    from modpipe.textmodel.build import EXTRA_REPEAT, BuildError, build
    from modpipe.textmodel.data import ExtraDataError

    settings = Settings.from_env()
    profile = args.profile or settings.model_profile
    if args.extra_repeat is not None and (args.extra_data is None or args.extra_repeat < 1):
        print("modpipe model build: --extra-repeat needs --extra-data and N >= 1", file=sys.stderr)
        return 2
    from modpipe.textmodel.platforms import BY_REGISTER, CorpusMissing

    unknown = [r for r in args.leave_out if r not in BY_REGISTER]
    if args.leave_out and (args.platforms is False or unknown):
        print(f"modpipe model build: --leave-out needs the platforms and a register of {sorted(BY_REGISTER)}",
              file=sys.stderr)
        return 2
    try:
        path = build(settings, profile, base=args.base, force=args.force, reuse_any=args.reuse_any, seed=args.seed,
                     device=args.device, base_layers=args.base_layers, extra=args.extra_data,
                     extra_repeat=args.extra_repeat or EXTRA_REPEAT, platforms=args.platforms,
                     leave_out=tuple(args.leave_out))
    except (BuildError, ExtraDataError, CorpusMissing) as exc:
        print(f"modpipe model build: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def build_splits(path: Path, settings: Settings) -> tuple[list, list]:
    """A build's train split (re-derived from the data, checked against its split.json) and test split."""
    from modpipe.textmodel import data

    split = json.loads((path / "split.json").read_text())
    loc, leave_out = None, frozenset()
    if "platforms" in split:
        from modpipe.textmodel import platforms

        loc, leave_out = platforms.locator(settings), frozenset(split["platforms"].get("leave_out", ()))
    corpus = data.load_corpus(settings.cache_dir, int(split["seed"]), platforms_loc=loc, leave_out=leave_out)
    test = data.read_jsonl(path / "heldout.jsonl")
    for name, exs in (("train", corpus.splits["train"]), ("test", test)):
        if data.split_hash(exs) != split["sha256"][name]:
            raise SystemExit(f"modpipe model eval: the {name} split differs from {path}/split.json "
                             "(data or split code changed); rebuild with `modpipe model build`")
    return corpus.splits["train"], test


def evaluate_build(path: Path, settings: Settings) -> dict:
    """Re-evaluate a build on its recorded test split (train split re-derived and checked against split.json)."""
    from modpipe.textmodel import evaluate
    from modpipe.textmodel.tokenize import BatchTokenizer

    build = artifacts_build(path)
    train, test = build_splits(build.path, settings)
    datasets = evaluate.evaluate(build.onnx, BatchTokenizer.for_build(build), train, test, stack=build.stack())
    served = build.served
    return {"model_dir": str(build.path), "version": served["version"], "precision": served["precision"],
            "profile": served.get("profile"), "split": "test", "baseline": evaluate.Baseline.DESCRIPTION,
            "datasets": datasets}


def artifacts_build(path: Path | None):
    from modpipe.textmodel.artifacts import ModelBuild, ModelNotBuilt, resolve_model

    if path is None:
        return resolve_model(Settings.from_env())
    path = Path(path).expanduser()
    if not (path / "model.onnx").exists():
        raise ModelNotBuilt(f"{path} holds no model.onnx")
    return ModelBuild(path.resolve())


def _eval(args: argparse.Namespace) -> int:
    from modpipe.textmodel.artifacts import ModelNotBuilt
    from modpipe.textmodel.evaluate import format_table

    settings = Settings.from_env()
    if sum((args.robustness, args.ood, args.platforms)) > 1:
        print("modpipe model eval: --robustness, --ood and --platforms are three reports; ask for one",
              file=sys.stderr)
        return 2
    if args.platforms:
        return _eval_platforms(args, settings)
    if args.robustness:
        return _eval_robustness(args, settings)
    if args.ood and args.attack_seed is None and args.attack_rate is None:
        return _eval_ood(args, settings)
    if args.before or args.attack_seed is not None or args.attack_rate is not None:
        print("modpipe model eval: --before needs --robustness or --ood; --attack-seed and --attack-rate need "
              "--robustness", file=sys.stderr)
        return 2
    try:
        result = evaluate_build(args.model_dir, settings)
    except ModelNotBuilt as exc:
        print(f"modpipe model eval: {exc}", file=sys.stderr)
        return 1
    _log.info("evaluated", extra={"model_dir": result["model_dir"],
                                  "f1": {ds: v["model"]["f1"] for ds, v in result["datasets"].items()}})
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['version']} ({result['precision']}) at {result['model_dir']}; test split; "
              f"baseline = {result['baseline']}")
        print(format_table(result["datasets"]))
    return 0


def _eval_robustness(args: argparse.Namespace, settings: Settings) -> int:
    from modpipe.textmodel import robustness
    from modpipe.textmodel.artifacts import ModelNotBuilt

    seed = robustness.ATTACK_SEED if args.attack_seed is None else args.attack_seed
    rate = robustness.ATTACK_RATE if args.attack_rate is None else args.attack_rate
    if not 0 < rate <= 1:
        print("modpipe model eval: --attack-rate must be in (0, 1]", file=sys.stderr)
        return 2
    try:
        build = artifacts_build(args.model_dir)
        before = artifacts_build(args.before) if args.before else None
    except ModelNotBuilt as exc:
        print(f"modpipe model eval: {exc}", file=sys.stderr)
        return 1
    from modpipe.textmodel.data import read_jsonl, shared_datasets

    train, test = build_splits(build.path, settings)
    if before is not None:
        # two builds compare on the data sets whose test texts they share, in whatever order each wrote them
        # (a data set added to training adds its own test texts and leaves the others' as they were)
        shared = shared_datasets(test, read_jsonl(before.path / "heldout.jsonl"))
        if not shared:
            print(f"modpipe model eval: {before.path} shares no data set's test texts with {build.path}; "
                  "--before needs the same ones", file=sys.stderr)
            return 2
        left_out = sorted({e.dataset for e in test} - shared)
        if left_out:
            _log.warning("robustness compared on the data sets both builds test alike",
                         extra={"compared": sorted(shared), "left_out": left_out})
            test = [e for e in test if e.dataset in shared]
    result = robustness.report(build, train, test, seed, rate, before)
    _log.info("robustness evaluated", extra={"model_dir": str(build.path), "worst_gap": result["model"]["worst_gap"],
                                             "target_met": result["targets"]["met"]})
    print(json.dumps(result, indent=2) if args.json else robustness.format_report(result))
    return 0


def _eval_ood(args: argparse.Namespace, settings: Settings) -> int:
    from modpipe.textmodel import ood
    from modpipe.textmodel.artifacts import ModelNotBuilt

    try:
        build = artifacts_build(args.model_dir)
        before = artifacts_build(args.before) if args.before else None
    except ModelNotBuilt as exc:
        print(f"modpipe model eval: {exc}", file=sys.stderr)
        return 1
    train, test = build_splits(build.path, settings)
    result = ood.report(build, train, test, settings.cache_dir, before)
    _log.info("out-of-domain evaluated", extra={"model_dir": str(build.path), "overall": result["overall"]})
    print(json.dumps(result, indent=2) if args.json else ood.format_report(result))
    return 0


def _eval_platforms(args: argparse.Namespace, settings: Settings) -> int:
    from modpipe.textmodel import data, platform_report, platforms
    from modpipe.textmodel.artifacts import ModelNotBuilt

    try:
        build = artifacts_build(args.model_dir)
    except ModelNotBuilt as exc:
        print(f"modpipe model eval: {exc}", file=sys.stderr)
        return 1
    try:
        train, _ = build_splits(build.path, settings)
        rows, _ = data.platform_rows(platforms.locator(settings), [e.text for e in data.load_sms()])
    except platforms.CorpusMissing as exc:
        print(f"modpipe model eval: {exc}", file=sys.stderr)
        return 1
    result = platform_report.report(build, train, rows)
    _log.info("platforms evaluated", extra={"model_dir": str(build.path), "targets_met": result["targets_met"]})
    print(json.dumps(result, indent=2) if args.json else platform_report.format_report(result))
    return 0
