"""The two reference paths: the seed (one blocking gRPC request per post to Triton, batch 1, padded to 128)
and the ceiling (in-process ONNX Runtime on the same model file, the best of a few batch sizes)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from modpipe.loadgen.bench.metering import stats_delta, triton_stats
from modpipe.simulation.metrics import latency_summary

from modpipe.textmodel.tokenize import BatchTokenizer

DEFAULT_CEILING_BATCHES = (8, 16, 32, 64)
UNTRIMMED_PROBE = 48  # texts of the batch-1 width-128 compute probe (every row costs the same)


def ort_options(variant: str = "cpu") -> dict[str, str]:
    """The thread counts Triton's spam_text runs ONNX Runtime with (its config.pbtxt parameters), with
    ORT's default spinning: the ceiling has the machine to itself, where spinning threads cost nothing
    and answer faster (Triton turns spinning off because it shares the cores with the pipeline)."""
    from modpipe.serving import repository

    config = repository.read_config(repository.template_models(variant)[repository.TEXT_MODEL] / "config.pbtxt")
    params = {k: v.string_value for k, v in config.parameters.items()}
    return {"intra_op_threads": params.get("intra_op_threads", "2"),
            "inter_op_threads": params.get("inter_op_threads", "1"),
            "allow_spinning": "1"}

def ort_session(path: Path, options: dict[str, str]):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(options["intra_op_threads"])
    opts.inter_op_num_threads = int(options["inter_op_threads"])
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", options["allow_spinning"])
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])

def seed_pass(url: str, model: str, tok: BatchTokenizer, texts: Sequence[str], tick: Callable[[int], None],
              timeout_s: float = 30.0) -> dict:
    """One blocking gRPC request per text, padded to 128, batch 1; tokenization inside the clock."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    outputs = [grpcclient.InferRequestedOutput("logits")]

    def one(text: str) -> np.ndarray:
        ids, mask = tok([text], pad_to_max=True)
        a = grpcclient.InferInput("input_ids", list(ids.shape), "INT64")
        a.set_data_from_numpy(ids)
        b = grpcclient.InferInput("attention_mask", list(mask.shape), "INT64")
        b.set_data_from_numpy(mask)
        return client.infer(model, [a, b], outputs=outputs, client_timeout=timeout_s).as_numpy("logits")

    try:
        for text in texts[:3]:  # channel + first-call warm-up, outside the clock
            one(text)
        before = triton_stats(url, model)
        latencies = []
        t_start = time.perf_counter()
        for text in texts:
            t0 = time.perf_counter()
            one(text)
            latencies.append((time.perf_counter() - t0) * 1000)
            tick(1)
        wall = time.perf_counter() - t_start
        server = stats_delta(before, triton_stats(url, model), wall)
    finally:
        client.close()
    lat = latency_summary(latencies)
    return {"posts_per_s": round(len(texts) / wall, 2), "texts": len(texts), "wall_s": round(wall, 2),
            "p50_ms": lat["p50_ms"], "p99_ms": lat["p99_ms"], "width": tok.max_len, "batch": 1, "server": server}

def untrimmed_probe(session, tok: BatchTokenizer, texts: Sequence[str]) -> dict:
    """In-process ORT at batch 1, width 128: the compute the seed paid on a server that runs the padding
    (every row costs the same at a fixed width, so a few dozen texts suffice)."""
    ids, mask = tok(list(texts[:1]), pad_to_max=True)
    session.run(["logits"], {"input_ids": ids, "attention_mask": mask})
    t_start = time.perf_counter()
    for text in texts:
        ids, mask = tok([text], pad_to_max=True)
        session.run(["logits"], {"input_ids": ids, "attention_mask": mask})
    wall = time.perf_counter() - t_start
    return {"posts_per_s": round(len(texts) / wall, 2), "texts": len(texts), "width": tok.max_len}

def ceiling_pass(session, tok: BatchTokenizer, texts: Sequence[str], batch_sizes: Sequence[int],
                 tick: Callable[[int], None]) -> dict:
    """In-process ORT at each batch size, per-batch padding, tokenization inside the clock; best wins."""
    rows = []
    for batch in batch_sizes:
        ids, mask = tok(list(texts[:batch]))
        session.run(["logits"], {"input_ids": ids, "attention_mask": mask})  # arena for this shape class
        widths = []
        t_start = time.perf_counter()
        for i in range(0, len(texts), batch):
            ids, mask = tok(texts[i:i + batch])
            session.run(["logits"], {"input_ids": ids, "attention_mask": mask})
            widths.append(ids.shape[1])
            tick(ids.shape[0])
        wall = time.perf_counter() - t_start
        rows.append({"batch": batch, "posts_per_s": round(len(texts) / wall, 2), "wall_s": round(wall, 2),
                     "mean_width": round(float(np.mean(widths)), 1)})
    best = max(rows, key=lambda r: r["posts_per_s"])
    return {"posts_per_s": best["posts_per_s"], "best_batch": best["batch"], "by_batch": rows}
