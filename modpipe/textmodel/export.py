"""ONNX export (legacy TorchScript exporter), the PyTorch-vs-ONNX Runtime check, int8 static quantization."""

from __future__ import annotations

import contextlib
import io
import re
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from modpipe import log
from modpipe.textmodel.artifacts import INPUT_NAMES, OUTPUT_NAME
from modpipe.textmodel.tokenize import BatchTokenizer

_log = log.get(__name__)

OPSET = 17
MAX_ABS_DIFF = 1e-4


class ExportMismatch(RuntimeError):
    """ONNX Runtime's logits differ from PyTorch's by more than the tolerance."""


class _LogitsOnly(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits


def export_onnx(model, path: Path, opset: int = OPSET) -> Path:
    """fp32 ONNX with dynamic batch and sequence axes: input_ids, attention_mask (int64) -> logits."""
    model = model.float().eval()
    if hasattr(model.config, "_attn_implementation"):
        model.config._attn_implementation = "eager"  # plain matmul/softmax graph, no SDPA mask tricks
    wrapper = _LogitsOnly(model).eval()
    vocab = model.config.vocab_size
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 2088, 102, 0]], dtype=torch.long) % vocab
    mask = (ids != 0).long()
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            OUTPUT_NAME: {0: "batch"}}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, (ids, mask), str(path), input_names=list(INPUT_NAMES), output_names=[OUTPUT_NAME],
                          dynamic_axes=axes, opset_version=opset, do_constant_folding=True, dynamo=False)
    import onnx

    onnx.checker.check_model(str(path))
    _log.info("exported ONNX", extra={"path": str(path), "opset": opset, "bytes": path.stat().st_size})
    return path


def ort_session(path: Path, threads: int = 2):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def compare_with_torch(model, onnx_path: Path, tok: BatchTokenizer, texts: Sequence[str],
                       batch_size: int = 16) -> dict:
    """Max |logit difference| between PyTorch (fp32) and ONNX Runtime on `texts`, per-batch padding."""
    sess = ort_session(onnx_path)
    model = model.float().eval()
    worst = 0.0
    for start in range(0, len(texts), batch_size):
        ids, mask = tok(texts[start:start + batch_size])
        with torch.no_grad():
            ref = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
        got = sess.run([OUTPUT_NAME], {"input_ids": ids, "attention_mask": mask})[0]
        worst = max(worst, float(np.max(np.abs(ref - got))))
    result = {"texts": len(texts), "max_abs_diff": worst, "tolerance": MAX_ABS_DIFF, "ok": worst <= MAX_ABS_DIFF}
    _log.info("ONNX vs PyTorch", extra=result)
    return result


# The FFN output projections (lin2, whose input is GELU's wide, heavy-tailed output) of the lower half of the
# layers stay fp32: an error made low is carried through every layer above. Validation spam F1 against fp32 on
# build full-9cc2a0799555d34a, SMS / SpamAssassin points: every MatMul int8 -0.1 / -0.4; lower lin2 fp32
# (this rule) +0.6 / -0.2, 1.6x faster than fp32 on a VNNI CPU (docs/benchmarks.md, "Static int8").
_LIN2 = re.compile(r"layer\.(\d+)/ffn/lin2/")


def fp32_nodes(onnx_path: Path) -> list[str]:
    """The MatMuls `quantize_int8` keeps in fp32: lin2 of the lower half of the transformer's layers."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    lin2 = {n.name: int(m.group(1)) for n in graph.node if n.op_type == "MatMul" and (m := _LIN2.search(n.name))}
    layers = max(lin2.values(), default=-1) + 1
    return sorted(name for name, layer in lin2.items() if layer < (layers + 1) // 2)


def quantize_int8(src: Path, dst: Path, tok: BatchTokenizer, calibration: Sequence[str]) -> Path:
    """Static int8 (QDQ) with ONNX Runtime: scales fixed at build time from `calibration` texts.

    Static, because a verdict must not depend on what a text is batched with: dynamic quantization computes
    one activation scale per batch and moved a text's probability by up to 0.06 with its neighbours. Every
    MatMul (the linear layers and attention's two products) but `fp32_nodes`: weights int8 per output channel,
    activations uint8 with the 99.999th percentile of the calibration as range (the extremes of MinMax cost
    1.4 points of F1). `reduce_range` (7-bit weights): CPUs without VNNI multiply uint8 x int8 with
    VPMADDUBSW, whose 16-bit sums saturate at full range; with 7 bits every x86 CPU computes what the build
    validated, and it cost no speed on a VNNI CPU."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    # the percentile calibrator stacks every run's activations: one shape, the window, for all
    feeds = iter([dict(zip(INPUT_NAMES, tok([text], pad_to_max=True), strict=True)) for text in calibration])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

    with tempfile.TemporaryDirectory(dir=dst.parent) as tmp:
        pre = Path(tmp) / "pre.onnx"
        # symbolic shape inference fails on the exported attention's reshapes; ONNX's own inference suffices
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
        with contextlib.redirect_stdout(io.StringIO()):  # the calibrator prints its progress
            quantize_static(str(pre), str(dst), Reader(), quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"],
                            per_channel=True, reduce_range=True, activation_type=QuantType.QUInt8,
                            weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.Percentile,
                            nodes_to_exclude=fp32_nodes(pre))
    _log.info("quantized int8", extra={"path": str(dst), "bytes": dst.stat().st_size, "calibration": len(calibration)})
    return dst
