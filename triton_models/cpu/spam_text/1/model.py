"""spam_text in Triton's python backend: the build's model run by ONNX Runtime (cpu variant) or PyTorch
(cuda variant: fp16 on the GPU Triton gives the instance, fp32 when the instance is a CPU one).

The cuda variant's directory (triton_models/cuda/spam_text) holds only its config and card: the assembler
lays it over this one, so both variants run this file and differ by the config's `runtime` parameter.

Triton hands `execute` every request the dynamic batcher grouped together, each with its own
sequence length (clients pad per batch). We gather their rows, sort them by true length (the mask)
and run ONNX Runtime on runs of similar length, each padded only to its own longest row and holding
at most `bucket_tokens` padded tokens (split where a call of its own costs less than the padding,
`run_overhead_tokens`), then put the logits back in request order.

Why: a streamed batch mixes 20-token chat lines with 128-token e-mails. Padding all of them to 128
computes mostly padding; sorted sub-batches compute (almost) only real tokens. On a CPU, runs of
~16 long rows are also where ONNX Runtime is fastest (bigger batches spill its caches).

The weights are not in git: the launcher (modpipe.serving.repository) links the build's
`model.onnx` (onnxruntime) or `torch/` (torch) into this version directory, next to this file.

Numeric I/O works with numpy 1 and 2 in the stub's environment (input_array / output_tensor: what was
measured with Triton 2.51's stub is written beside them).
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def real_lengths(mask):
    """Tokens per row up to its last unmasked position (rows are left-aligned; 0 for an empty row)."""
    present = mask != 0
    last = present.shape[1] - np.argmax(present[:, ::-1], axis=1)
    return np.where(present.any(axis=1), last, 0)


def length_runs(lengths, bucket_tokens, run_overhead_tokens=0):
    """Row indices grouped into runs of similar length, shortest first: each run is padded to its own
    longest row (at least 1) and holds at most `bucket_tokens` padded tokens (at least one row).
    Yields (row indices, width).

    `run_overhead_tokens` > 0: the runs are the cheapest split of the sorted rows, a run costing that
    many tokens more than the tokens it computes (ONNX Runtime's fixed cost of a call, in tokens): a
    20-token chat line is then not padded to a 128-token e-mail's width for a batch of two, which
    would cost more than a call of its own. 0: consecutive rows fill each run up to `bucket_tokens`."""
    order = np.argsort(lengths, kind="stable")
    widths = [max(1, int(lengths[i])) for i in order]
    if run_overhead_tokens > 0:
        bounds = _cheapest_runs(widths, bucket_tokens, run_overhead_tokens)
    else:
        bounds, start = [], 0
        while start < len(widths):
            end = start + 1
            while end < len(widths) and widths[end] * (end - start + 1) <= bucket_tokens:
                end += 1
            bounds.append((start, end))
            start = end
    for start, end in bounds:
        yield order[start:end], widths[end - 1]


def _cheapest_runs(widths, bucket_tokens, overhead):
    """(start, end) of the runs of `widths` (ascending) that minimise the sum over runs of overhead +
    rows x width, each within `bucket_tokens` unless it is one row: dynamic programming over split points."""
    n = len(widths)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for end in range(1, n + 1):
        width = widths[end - 1]  # the longest row of any run that ends here
        for start in range(end - 1, -1, -1):
            rows = end - start
            if rows > 1 and rows * width > bucket_tokens:
                break
            cost = best[start] + overhead + rows * width
            if cost < best[end]:
                best[end], cut[end] = cost, start
    bounds, end = [], n
    while end > 0:
        bounds.append((cut[end], end))
        end = cut[end]
    return bounds[::-1]


def _param(config, key, default):
    value = config.get("parameters", {}).get(key, {}).get("string_value", "")
    return value if value not in ("", None) else default


_NUMPY2 = np.lib.NumpyVersion(np.__version__) >= "2.0.0"


def input_array(request, name):
    """A numeric input through DLPack: as_numpy() returns wrong data under numpy 2 (measured), this does not."""
    return np.from_dlpack(pb_utils.get_input_tensor_by_name(request, name))


def output_tensor(name, array):
    """A numeric output: DLPack under numpy 2 (Tensor(name, array) came back empty), the plain constructor
    under numpy 1 (from_dlpack of a numpy 1 array killed the stub). Contiguous, writable, owned."""
    array = np.require(array, requirements=["C", "W", "O"])
    return pb_utils.Tensor.from_dlpack(name, array) if _NUMPY2 else pb_utils.Tensor(name, array)


class OnnxRuntimeLogits:
    """logits = model(ids, mask) with ONNX Runtime's CPU execution provider (the cpu variant)."""

    def __init__(self, here, config):
        import onnxruntime as ort

        path = os.path.join(here, _param(config, "onnx_file", "model.onnx"))
        if not os.path.exists(path):
            raise pb_utils.TritonModelException(f"no ONNX model at {path}: run `modpipe model build`")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(_param(config, "intra_op_threads", "2"))
        opts.inter_op_num_threads = int(_param(config, "inter_op_threads", "1"))
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # "0": idle ORT threads sleep instead of spinning; they then leave the cores to the stream
        # workers and the client that share the machine (at a small wake-up latency cost).
        opts.add_session_config_entry("session.intra_op.allow_spinning", _param(config, "allow_spinning", "1"))
        self.session = ort.InferenceSession(path, sess_options=opts, providers=["CPUExecutionProvider"])
        self.device = "cpu"

    def __call__(self, ids, mask):
        return self.session.run(["logits"], {"input_ids": np.ascontiguousarray(ids),
                                             "attention_mask": np.ascontiguousarray(mask)})[0]


class TorchLogits:
    """logits = model(ids, mask) with PyTorch (the cuda variant): the build's `torch/` weights on the device
    Triton assigned this instance, fp16 on a GPU (`torch_dtype` "auto"), fp32 on a CPU."""

    def __init__(self, here, config, args):
        import torch
        from transformers import DistilBertForSequenceClassification

        path = os.path.join(here, _param(config, "torch_dir", "torch"))
        if not os.path.exists(os.path.join(path, "model.safetensors")):
            raise pb_utils.TritonModelException(
                f"no PyTorch weights at {path}: the build predates the cuda variant; rebuild it "
                "(`modpipe model build --force`)")
        if args.get("model_instance_kind") == "GPU":
            self.device = f"cuda:{args.get('model_instance_device_id', '0')}"
        else:
            self.device = "cpu"
            torch.set_num_threads(int(_param(config, "intra_op_threads", "2")))
        dtype = _param(config, "torch_dtype", "auto")
        if dtype == "auto":
            dtype = "float16" if self.device.startswith("cuda") else "float32"
        self.torch = torch
        self.model = DistilBertForSequenceClassification.from_pretrained(path).to(self.device, getattr(torch, dtype))
        self.model.eval()

    def __call__(self, ids, mask):
        torch = self.torch
        with torch.inference_mode():
            ids_t = torch.from_numpy(np.ascontiguousarray(ids)).to(self.device, non_blocking=True)
            mask_t = torch.from_numpy(np.ascontiguousarray(mask)).to(self.device, non_blocking=True)
            logits = self.model(input_ids=ids_t, attention_mask=mask_t).logits
            return logits.float().cpu().numpy()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        here = os.path.join(args["model_repository"], args["model_version"])
        runtime = _param(config, "runtime", "onnxruntime")
        if runtime == "onnxruntime":
            self.logits_of = OnnxRuntimeLogits(here, config)
        elif runtime == "torch":
            self.logits_of = TorchLogits(here, config, args)
        else:
            raise pb_utils.TritonModelException(f"unknown runtime {runtime!r}: onnxruntime or torch")
        self.pad_id = int(_param(config, "pad_id", "0"))
        self.max_seq_len = int(_param(config, "max_seq_len", "0"))  # 0: no cap
        self.trim_padding = _param(config, "trim_padding", "true").lower() == "true"
        # 0: one ORT run over the whole merged batch (padded to its longest row, or to the widest request
        # when trim_padding is off).
        self.bucket_tokens = int(_param(config, "bucket_tokens", "2048"))
        self.run_overhead_tokens = float(_param(config, "run_overhead_tokens", "0"))
        self.logits_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "logits")["data_type"])

    def execute(self, requests):
        ids_list, mask_list, errors = [], [], {}
        for i, request in enumerate(requests):
            ids = input_array(request, "input_ids")
            mask = input_array(request, "attention_mask")
            if ids.shape != mask.shape or ids.ndim != 2:
                errors[i] = f"input_ids {ids.shape} and attention_mask {mask.shape} must be the same [batch, seq]"
                ids = mask = np.zeros((0, 1), dtype=np.int64)
            ids_list.append(ids)
            mask_list.append(mask)

        rows = [a.shape[0] for a in ids_list]
        width = max((a.shape[1] for a in ids_list if a.shape[0]), default=1)
        if self.max_seq_len:
            width = min(width, self.max_seq_len)
        total = sum(rows)
        ids = np.full((total, width), self.pad_id, dtype=np.int64)
        mask = np.zeros((total, width), dtype=np.int64)
        start = 0
        for a_ids, a_mask, n in zip(ids_list, mask_list, rows, strict=True):
            w = min(a_ids.shape[1], width)
            ids[start:start + n, :w] = a_ids[:, :w]
            mask[start:start + n, :w] = a_mask[:, :w]
            start += n

        logits = np.zeros((total, 2), dtype=np.float32)
        if total and self.bucket_tokens > 0:
            for rows_of_run, run_width in length_runs(real_lengths(mask), self.bucket_tokens,
                                                      self.run_overhead_tokens):
                logits[rows_of_run] = self._run(ids[rows_of_run, :run_width], mask[rows_of_run, :run_width])
        elif total:
            if self.trim_padding:
                # Columns that are padding in every row change nothing (they are masked): a client that
                # pads to 128 then costs what per-batch padding costs.
                width = max(1, int(real_lengths(mask).max()))
                ids, mask = ids[:, :width], mask[:, :width]
            logits = self._run(ids, mask)
        logits = logits.astype(self.logits_dtype, copy=False)

        responses, start = [], 0
        for i, n in enumerate(rows):
            if i in errors:
                responses.append(pb_utils.InferenceResponse(output_tensors=[],
                                                            error=pb_utils.TritonError(errors[i])))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    output_tensor("logits", logits[start:start + n])]))
            start += n
        return responses

    def _run(self, ids, mask):
        return self.logits_of(ids, mask)

    def finalize(self):
        self.logits_of = None
