"""ONNX export (legacy TorchScript exporter), the PyTorch-vs-ONNX Runtime check, int8 dynamic quantization."""

from __future__ import annotations

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


def quantize_int8(src: Path, dst: Path) -> Path:
    """Dynamic (weights int8, activations quantized at run time) quantization with ONNX Runtime."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True)
    _log.info("quantized int8", extra={"path": str(dst), "bytes": dst.stat().st_size})
    return dst
