"""Probe: which MatMuls must stay fp32 for a build's static int8 model to keep its validation accuracy?

    [MODPIPE_MODEL_DIR=DIR] .venv/bin/python scripts/int8_layers_probe.py [--variants NAME,...]

The build quantizes every MatMul but `export.fp32_nodes` (lin2 of the lower half of the layers) and serves int8
only if `build.int8_keeps_accuracy` holds on the validation split. This quantizes the build's `model.fp32.onnx`
with other sets of fp32 MatMuls (the same calibration texts, the same quantizer settings), applies the build's
rule to each, and times each beside fp32 on the same validation texts (alternating, best of two), so that a
variant is chosen by validation and cost alone.
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from modpipe.settings import Settings
from modpipe.textmodel import build as B
from modpipe.textmodel import data, evaluate, export, train
from modpipe.textmodel.artifacts import resolve_model
from modpipe.textmodel.tokenize import BatchTokenizer

_NODE = re.compile(r"layer\.(\d+)/(attention|ffn)/(?:(\w+)/)?MatMul")


def _kind(name: str) -> tuple[int, str] | None:
    """(layer, kind): lin1 / lin2 (FFN), linear (attention's q, k, v and out projections) or products (its
    two activation-by-activation MatMuls, Q.K^T and attention.V)."""
    m = _NODE.search(name)
    if not m:
        return None
    if m.group(2) == "ffn":
        return int(m.group(1)), m.group(3)
    return int(m.group(1)), "linear" if m.group(3) else "products"


# variant -> (layer, kind, layers) -> stays fp32
VARIANTS = {
    "lower lin2 (built)": lambda layer, kind, n: kind == "lin2" and layer < (n + 1) // 2,
    "all lin2": lambda layer, kind, n: kind == "lin2",
    "all lin2 + lower lin1": lambda layer, kind, n: kind == "lin2" or (kind == "lin1" and layer < (n + 1) // 2),
    "all FFN": lambda layer, kind, n: kind in ("lin1", "lin2"),
    "lower lin2 + top layer": lambda layer, kind, n: (kind == "lin2" and layer < (n + 1) // 2) or layer == n - 1,
    "lower lin2 + top layer FFN": lambda layer, kind, n: ((kind == "lin2" and layer < (n + 1) // 2)
                                                          or (layer == n - 1 and kind in ("lin1", "lin2"))),
    "lower lin2 + products": lambda layer, kind, n: (kind == "lin2" and layer < (n + 1) // 2) or kind == "products",
    "all lin2 + products": lambda layer, kind, n: kind in ("lin2", "products"),
    "all attention": lambda layer, kind, n: kind in ("linear", "products"),
}


def keep_fp32(rule):
    def nodes(onnx_path: Path) -> list[str]:
        import onnx

        graph = onnx.load(str(onnx_path), load_external_data=False).graph
        kinds = {n.name: k for n in graph.node if n.op_type == "MatMul" and (k := _kind(n.name))}
        layers = max(layer for layer, _ in kinds.values()) + 1
        return sorted(name for name, (layer, kind) in kinds.items() if rule(layer, kind, layers))
    return nodes


def metrics(path: Path, window: BatchTokenizer, val, labels: np.ndarray) -> dict:
    prob = evaluate.onnx_spam_proba(path, window, [e.text for e in val], desc=path.name)
    per = {ds: evaluate.classification_metrics(labels[idx], prob[idx], 0.5)
           for ds, idx in evaluate.by_dataset(val).items()}
    per["all"] = evaluate.classification_metrics(labels, prob, 0.5)
    return per


def ms_per_text(path: Path, window: BatchTokenizer, texts: list[str]) -> float:
    start = time.perf_counter()
    evaluate.onnx_spam_proba(path, window, texts, progress=False)
    return (time.perf_counter() - start) * 1000 / len(texts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", help="comma-separated names of VARIANTS (default: all)")
    ap.add_argument("--timing-texts", type=int, default=600)
    ap.add_argument("--calibration", type=int, default=B.INT8_CALIBRATION_TEXTS, help="calibration texts")
    ap.add_argument("--percentile", type=float, help="activation range percentile (the build's: 99.999)")
    args = ap.parse_args()
    settings = Settings.from_env()
    build = resolve_model(settings)
    seed = int(build.served.get("seed", 0))
    profile = B.PROFILES[build.served["profile"]]
    splits = data.load_corpus(settings.cache_dir, seed).splits
    window = BatchTokenizer.for_build(build)
    val = train.subset(splits["validation"], profile.train.val_fraction, seed)
    labels = np.array([e.label for e in val])
    calibration = random.Random(seed).sample([e.text for e in splits["train"]],
                                             min(args.calibration, len(splits["train"])))
    if args.percentile:
        import onnxruntime.quantization as q

        static = q.quantize_static

        def with_percentile(*a, **kw):
            return static(*a, **kw, extra_options={"CalibPercentile": args.percentile})
        q.quantize_static = with_percentile
    fp32 = build.path / "model.fp32.onnx"
    ref = metrics(fp32, window, val, labels)
    timing = random.Random(1).sample([e.text for e in val], min(args.timing_texts, len(val)))
    names = args.variants.split(",") if args.variants else list(VARIANTS)
    print(f"{build.version}: validation {len(val):,} texts; fp32 spam F1 all {ref['all']['f1']}; calibration "
          f"{len(calibration)} texts, percentile {args.percentile or 'as built'}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            dst = Path(tmp) / (re.sub(r"\W+", "_", name) + ".onnx")
            kept_fp32 = keep_fp32(VARIANTS[name])
            original = export.fp32_nodes
            export.fp32_nodes = kept_fp32
            try:
                export.quantize_int8(fp32, dst, window, calibration)
            finally:
                export.fp32_nodes = original
            kept, drops, extra = B.int8_keeps_accuracy(ref, metrics(dst, window, val, labels))
            cost = {"fp32": [], "int8": []}
            for _ in range(2):
                cost["fp32"].append(ms_per_text(fp32, window, timing))
                cost["int8"].append(ms_per_text(dst, window, timing))
            f32, i8 = min(cost["fp32"]), min(cost["int8"])
            print(f"{name:<28} kept {kept!s:<5} drop all {drops['all']:+.4f} extra errors "
                  f"{ {k: v for k, v in extra.items() if v} } | {i8:.2f} ms a text vs fp32 {f32:.2f}: "
                  f"{f32 / i8:.2f}x | {len(kept_fp32(fp32))} MatMuls fp32", flush=True)


if __name__ == "__main__":
    main()
