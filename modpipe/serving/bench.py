"""`modpipe bench model`: throughput and latency of the text model through Triton vs an in-process ceiling.

One run measures, on the same held-out texts (the build's heldout.jsonl, a fixed sample):

- Triton (gRPC, client-side tokenization) at each request size x requests in flight, with per-batch
  padding (to the longest text of the request) and with fixed padding to max_seq_len; request size 1
  with fixed padding is the seed's request shape (one text, padded to 128, batch 1);
- the in-process ceiling at the same request sizes and both paddings, no server: ONNX Runtime on the
  CPU (same model file and thread count as the cpu variant) or PyTorch on a device (the build's `torch/`
  weights, fp16 on a GPU: what the cuda variant runs).

- the build's lexical stack in process on one thread (what the worker adds to Triton's answer), as texts/s
  and as a share of the ceiling's time per text; and the worker's whole client-side text path (tokenize +
  stack) in CPU time per text, with the tokenizer's normaliser run once (as served) and twice.

- the text paths side by side (`text_paths`), the same texts in requests of MODPIPE_MAX_BATCH, with neither
  cache: the client's CPU per text (this process: tokenizing, the stack, the request) and Triton's (its whole
  process group, when it runs on this machine) for `worker` (tokenize here, spam_text, the stack here: the
  python head, as before charhead.py, and the numpy head) and `triton` (raw texts to spam_text_ensemble).

Tokenization happens before the clock starts, in both cases, so the ratios isolate serving cost. `--gpu`
is the GPU section's preset: request sizes 1/64/256, 1/2/8/32 in flight, PyTorch's ceiling on CUDA.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from modpipe.services.process import group_cpu_seconds
from modpipe.serving.charhead import CharHead
from modpipe.serving.client import TextModelClient
from modpipe.textmodel.artifacts import ModelBuild
from modpipe.textmodel.tokenize import BatchTokenizer

DEFAULT_BATCH_SIZES = (1, 8, 32, 64)
GPU_BATCH_SIZES = (1, 64, 256)
GPU_INFLIGHT = (1, 2, 8, 32)
PADDINGS = ("batch", "fixed")
CEILINGS = ("ort", "torch", "none")


def bench_texts(build: ModelBuild, n: int, seed: int = 0) -> list[str]:
    """`n` held-out texts in a fixed random order (repeated if the split is smaller)."""
    texts = [row["text"] for row in build.heldout() if row.get("text")]
    if not texts:
        raise ValueError(f"{build.path}/heldout.jsonl has no texts to benchmark with")
    order = np.random.default_rng(seed).permutation(len(texts))
    return [texts[order[i % len(texts)]] for i in range(n)]


def _chunks(tok: BatchTokenizer, texts: Sequence[str], batch: int, padding: str):
    return [tok(texts[i:i + batch], pad_to_max=padding == "fixed") for i in range(0, len(texts), batch)]


def _summary(kind: str, batch: int, padding: str, n_texts: int, wall: float, latencies: list[float],
             chunks) -> dict:
    lat = np.array(latencies) * 1000.0
    return {"target": kind, "batch": batch, "padding": padding, "texts": n_texts, "requests": len(latencies),
            "texts_per_s": round(n_texts / wall, 2), "wall_s": round(wall, 3),
            "p50_ms": round(float(np.percentile(lat, 50)), 2), "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "mean_width": round(float(np.mean([c[0].shape[1] for c in chunks])), 1)}


async def _triton_pass(client: TextModelClient, chunks, inflight: int, tick: Callable[[int], None]):
    sem = asyncio.Semaphore(inflight)
    latencies: list[float] = []

    async def one(ids, mask):
        async with sem:
            t0 = time.perf_counter()
            await client.spam_probabilities(ids, mask)
            latencies.append(time.perf_counter() - t0)
            tick(ids.shape[0])

    t0 = time.perf_counter()
    await asyncio.gather(*(one(ids, mask) for ids, mask in chunks))
    return time.perf_counter() - t0, latencies


async def _stats(client: TextModelClient) -> tuple[int, int]:
    st = await client.client.get_inference_statistics(client.model_name, as_json=True)
    ms = st["model_stats"][0]
    return int(ms.get("inference_count", 0)), int(ms.get("execution_count", 0))


async def bench_triton(url: str, model_name: str, tok: BatchTokenizer, texts: Sequence[str],
                       batch_sizes: Sequence[int], inflight: int | Sequence[int], tick: Callable[[int], None],
                       timeout_s: float = 60.0) -> tuple[list[dict], dict]:
    rows = []
    inflights = [inflight] if isinstance(inflight, int) else list(inflight)
    async with TextModelClient(url, model_name=model_name, timeout_s=timeout_s) as client:
        version = await client.model_versions()
        await client.spam_probabilities(*tok(texts[:8]))  # connection + first-call warm-up
        # padding modes alternate within each batch size: drift in machine load hits both alike
        for n_inflight in inflights:
            for batch in batch_sizes:
                for padding in PADDINGS:
                    chunks = _chunks(tok, texts, batch, padding)
                    inf0, exe0 = await _stats(client)
                    wall, lat = await _triton_pass(client, chunks, n_inflight, tick)
                    inf1, exe1 = await _stats(client)
                    row = _summary("triton", batch, padding, len(texts), wall, lat, chunks)
                    row["inflight"] = n_inflight
                    # > batch means the dynamic batcher merged requests in the server
                    row["server_avg_batch"] = round((inf1 - inf0) / max(exe1 - exe0, 1), 1)
                    rows.append(row)
    return rows, version


def _in_process(target: str, infer: Callable, tok: BatchTokenizer, texts: Sequence[str],
                batch_sizes: Sequence[int], tick: Callable[[int], None], **extra) -> list[dict]:
    """Time `infer(ids, mask)` (which returns when the result is there) per request, every size and padding."""
    infer(*tok(texts[:8]))  # first-call allocations and kernel choices stay out of the clock
    rows = []
    for batch in batch_sizes:
        for padding in PADDINGS:
            chunks = _chunks(tok, texts, batch, padding)
            latencies = []
            t_start = time.perf_counter()
            for ids, mask in chunks:
                t0 = time.perf_counter()
                infer(ids, mask)
                latencies.append(time.perf_counter() - t0)
                tick(ids.shape[0])
            row = _summary(target, batch, padding, len(texts), time.perf_counter() - t_start, latencies, chunks)
            rows.append({**row, **extra})
    return rows


def bench_ort(build: ModelBuild, tok: BatchTokenizer, texts: Sequence[str], batch_sizes: Sequence[int],
              tick: Callable[[int], None], threads: int = 2) -> list[dict]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(build.onnx), sess_options=opts, providers=["CPUExecutionProvider"])
    return _in_process("ort", lambda ids, mask: session.run(["logits"], {"input_ids": ids, "attention_mask": mask}),
                       tok, texts, batch_sizes, tick)


def bench_torch(build: ModelBuild, tok: BatchTokenizer, texts: Sequence[str], batch_sizes: Sequence[int],
                tick: Callable[[int], None], device: str = "auto", threads: int = 2) -> list[dict]:
    """PyTorch in process on the build's `torch/` weights: fp16 on CUDA (the cuda variant's runtime without
    the server), fp32 on the CPU. The clock stops after the device has finished (synchronize)."""
    import torch
    from transformers import DistilBertForSequenceClassification

    if not (build.torch_dir / "model.safetensors").exists():
        raise ValueError(f"{build.path} has no torch/ weights (built before the cuda variant): rebuild it")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(threads)
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    model = DistilBertForSequenceClassification.from_pretrained(str(build.torch_dir)).to(device, dtype).eval()

    @torch.inference_mode()
    def infer(ids, mask):
        model(input_ids=torch.from_numpy(ids).to(device), attention_mask=torch.from_numpy(mask).to(device))
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    return _in_process("torch", infer, tok, texts, batch_sizes, tick, device=device)


def div(a, b):
    return round(a / b, 3) if a and b else None


def ratios(triton_rows: list[dict], ort_rows: list[dict]) -> dict:
    """Triton against the ceiling per request size; where several in-flight levels ran, Triton's best."""
    def tps(rows, batch, padding):
        return max((r["texts_per_s"] for r in rows if r["batch"] == batch and r["padding"] == padding), default=None)

    out: dict = {"per_batch": {}}
    for batch in sorted({r["batch"] for r in triton_rows}):
        out["per_batch"][str(batch)] = {
            "triton_batch_vs_fixed_padding": div(tps(triton_rows, batch, "batch"), tps(triton_rows, batch, "fixed")),
            "ceiling_batch_vs_fixed_padding": div(tps(ort_rows, batch, "batch"), tps(ort_rows, batch, "fixed")),
            "triton_vs_ceiling": div(tps(triton_rows, batch, "batch"), tps(ort_rows, batch, "batch")),
        }
    best_triton = max((r["texts_per_s"] for r in triton_rows), default=None)
    best_ort = max((r["texts_per_s"] for r in ort_rows), default=None)
    out["best_triton_texts_per_s"] = best_triton
    out["best_ceiling_texts_per_s"] = best_ort
    out["best_triton_vs_best_ceiling"] = div(best_triton, best_ort)
    return out


def bench_stack(build: ModelBuild, texts: Sequence[str]) -> dict | None:
    """The worker's side of the text path beside Triton's (in process, best of 3 each, on the same texts): the
    build's lexical stack on the normalised texts (what the worker adds after Triton's answer: texts/s, us per
    text), and the whole client-side path (tokenize + stack) two ways, CPU time of all threads: `separate`
    normalises each text twice (the tokenizer, then the stack), `shared` once (`BatchTokenizer.encode_normalized`,
    what the worker does). None for a build without a stack."""
    stack = build.stack()
    if stack is None:
        return None
    tok = BatchTokenizer.for_build(build)
    model = np.full(len(texts), 0.5)
    normalized = tok.normalize(texts)
    stack.spam_proba(texts[:8], model[:8], normalized=normalized[:8])

    def separate():
        tok(texts)
        stack.spam_proba(texts, model)

    def shared():
        _, _, norm = tok.encode_normalized(texts)
        stack.spam_proba(texts, model, normalized=norm)

    def best_of_3(fn, clock) -> float:
        best = float("inf")
        for _ in range(3):
            t0 = clock()
            fn()
            best = min(best, clock() - t0)
        return best

    head_s = best_of_3(lambda: stack.spam_proba(texts, model, normalized=normalized), time.perf_counter)
    paths = {}
    for _ in range(2):  # alternated, so that a drift of the machine's speed touches both
        for name, fn in (("separate", separate), ("shared", shared)):
            cpu = best_of_3(fn, time.process_time) / len(texts) * 1e6
            paths[name] = round(min(cpu, paths.get(name, float("inf"))), 1)
    return {"texts": len(texts), "texts_per_s": round(len(texts) / head_s, 1),
            "us_per_text": round(head_s / len(texts) * 1e6, 1), "terms": len(stack.head.vocabulary),
            "client_cpu_us_per_text": paths, "shared_over_separate": div(paths["shared"], paths["separate"])}


def server_group(url: str) -> int | None:
    """Process group of the tritonserver on this machine listening on `url`'s gRPC port (the launcher starts it in
    a session of its own, its python backend stubs inside), or None."""
    port = url.rpartition(":")[2]
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if args and args[0].endswith(b"tritonserver") and f"--grpc-port={port}".encode() in args:
                with contextlib.suppress(OSError):
                    return os.getpgid(int(entry.name))
    return None


def group_cpu_s(pgid: int | None) -> float | None:
    """CPU seconds (user + system) of the live processes of a process group."""
    return None if pgid is None else group_cpu_seconds({"group": pgid})["group"]


def bench_text_paths(url: str, build: ModelBuild, model_name: str, texts: Sequence[str], batch: int = 64,
                     rounds: int = 2, timeout_s: float = 120.0) -> dict:
    """CPU per text of each text path, client and Triton side by side (module docstring), best of `rounds`
    alternated passes; and the largest difference between the paths' served probabilities."""
    stack = build.stack()
    tok = BatchTokenizer.for_build(build)
    fast = CharHead.of(stack.head) if stack is not None else None
    pgid = server_group(url)
    chunks = [list(texts[i:i + batch]) for i in range(0, len(texts), batch)]

    def served(proba, margins):
        return 1.0 / (1.0 + np.exp(-stack.decision(proba, margins)))

    async def worker_path(client, part, margins_of):
        ids, mask, normalized = tok.encode_normalized(part)
        proba = await client.spam_probabilities(ids, mask)
        return proba if stack is None else served(proba, margins_of(normalized))

    async def triton_path(client, part):
        return await client.spam_probabilities_text(part)

    paths = {"worker_python_head": lambda c, p: worker_path(c, p, stack.head.margins if stack else None),
             "worker_numpy_head": lambda c, p: worker_path(c, p, fast.margins if fast else
                                                           (stack.head.margins if stack else None)),
             "triton": triton_path}
    best: dict[str, dict] = {}
    values: dict[str, np.ndarray] = {}

    async def measure():
        async with TextModelClient(url, model_name=model_name, timeout_s=timeout_s) as client:
            for fn in paths.values():  # warm: connections, the ensemble's instances
                await fn(client, chunks[0][:8])
            for _ in range(rounds):
                for name, fn in paths.items():
                    server0, client0, wall0 = group_cpu_s(pgid), time.process_time(), time.perf_counter()
                    out = [await fn(client, part) for part in chunks]
                    wall = time.perf_counter() - wall0
                    client_s, server1 = time.process_time() - client0, group_cpu_s(pgid)
                    values[name] = np.concatenate(out)
                    row = {"client_cpu_us_per_text": round(client_s / len(texts) * 1e6, 1),
                           "triton_cpu_us_per_text": None if server0 is None else
                           round((server1 - server0) / len(texts) * 1e6, 1),
                           "texts_per_s": round(len(texts) / wall, 1)}
                    old = best.get(name)
                    if old is None or row["client_cpu_us_per_text"] < old["client_cpu_us_per_text"]:
                        best[name] = row

    asyncio.run(measure())
    base = values["worker_python_head"]
    return {"texts": len(texts), "batch": batch, "rounds": rounds, "triton_measured": pgid is not None,
            "paths": best,
            "max_abs_diff_vs_worker_python_head": {k: float(np.max(np.abs(v - base))) for k, v in values.items()}}


def run(url: str, build: ModelBuild, model_name: str, n_texts: int = 256,
        batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES, inflight: int | Sequence[int] = 2, include_ort: bool = True,
        ort_threads: int = 2, progress: bool = True, ceiling: str = "ort", torch_device: str = "auto") -> dict:
    from modpipe.output import progress_bar

    if not include_ort:
        ceiling = "none"
    if ceiling not in CEILINGS:
        raise ValueError(f"ceiling {ceiling!r}: expected one of {CEILINGS}")
    inflights = [inflight] if isinstance(inflight, int) else list(inflight)
    texts = bench_texts(build, n_texts)
    tok = BatchTokenizer.for_build(build)
    t0 = time.perf_counter()
    tok(texts)
    tokenize_s = time.perf_counter() - t0
    lengths = [len(ids) for ids in tok.ids(texts)]
    passes = len(batch_sizes) * len(PADDINGS) * (len(inflights) + (ceiling != "none"))
    with progress_bar(total=n_texts * passes, unit="text", enabled=progress, desc="bench model") as bar:
        triton_rows, version = asyncio.run(bench_triton(url, model_name, tok, texts, batch_sizes, inflights,
                                                        bar.update))
        if ceiling == "ort":
            ceiling_rows = bench_ort(build, tok, texts, batch_sizes, bar.update, ort_threads)
        elif ceiling == "torch":
            ceiling_rows = bench_torch(build, tok, texts, batch_sizes, bar.update, torch_device, ort_threads)
        else:
            ceiling_rows = []
    stack = bench_stack(build, texts)
    text_paths = bench_text_paths(url, build, model_name, texts)
    out_ratios = ratios(triton_rows, ceiling_rows)
    if stack is not None and out_ratios.get("best_ceiling_texts_per_s"):
        # its time per text as a share of the transformer's (the best in-process ceiling)
        stack["share_of_ceiling_time"] = round(out_ratios["best_ceiling_texts_per_s"] / stack["texts_per_s"], 4)
    return {
        "model": version, "build_path": str(build.path), "url": url, "texts": n_texts,
        "batch_sizes": list(batch_sizes), "inflight": inflights, "ort_threads": ort_threads, "ceiling": ceiling,
        "max_seq_len": build.max_seq_len,
        "tokens_per_text": {"mean": round(float(np.mean(lengths)), 1), "p50": float(np.median(lengths)),
                            "max": int(max(lengths))},
        "tokenize_texts_per_s": round(n_texts / tokenize_s, 1) if tokenize_s else None,
        "triton": triton_rows, "ceiling_rows": ceiling_rows, "ratios": out_ratios, "stack": stack,
        "text_paths": text_paths,
    }


def format_table(report: dict) -> str:
    lines = [f"model {report['model']['model']} build {report['model']['build_version']}  texts {report['texts']}  "
             f"tokens/text mean {report['tokens_per_text']['mean']}  ceiling {report['ceiling']}  url {report['url']}",
             "(request size 1 with fixed padding = the seed's request: one text padded to max_seq_len)",
             f"{'target':<7} {'padding':<7} {'batch':>5} {'inflight':>8} {'texts/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
             f"{'width':>6} {'srv batch':>9}"]
    rows = sorted(report["triton"], key=lambda r: (r["padding"], r["inflight"], r["batch"])) + \
        sorted(report["ceiling_rows"], key=lambda r: (r["padding"], r["batch"]))
    for row in rows:
        lines.append(f"{row['target']:<7} {row['padding']:<7} {row['batch']:>5} {row.get('inflight', ''):>8} "
                     f"{row['texts_per_s']:>9.1f} {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f} {row['mean_width']:>6.1f} "
                     f"{row.get('server_avg_batch', ''):>9}")
    lines.append("ratios (texts/s; Triton's best over in-flight levels):")
    for batch, r in report["ratios"]["per_batch"].items():
        lines.append(f"  batch {batch:>3}: triton per-batch/fixed padding {r['triton_batch_vs_fixed_padding']}, "
                     f"ceiling per-batch/fixed {r['ceiling_batch_vs_fixed_padding']}, triton/ceiling {r['triton_vs_ceiling']}")
    r = report["ratios"]
    lines.append(f"  best triton {r['best_triton_texts_per_s']} texts/s vs best ceiling {r['best_ceiling_texts_per_s']}: "
                 f"{r['best_triton_vs_best_ceiling']}")
    stack = report.get("stack")
    if stack:
        lines.append(f"lexical stack on normalised text, in process on one thread ({stack['terms']:,} terms): "
                     f"{stack['texts_per_s']} texts/s, {stack['us_per_text']} us/text"
                     + (f" = {stack['share_of_ceiling_time']:.1%} of the best ceiling's time per text"
                        if stack.get("share_of_ceiling_time") else ""))
        cpu = stack["client_cpu_us_per_text"]
        lines.append(f"worker's text path (tokenize + stack), CPU us/text: normaliser run twice {cpu['separate']}, "
                     f"once {cpu['shared']} (served: once); ratio {stack['shared_over_separate']}")
    paths = report.get("text_paths")
    if paths:
        lines.append(f"text paths, {paths['texts']} texts in requests of {paths['batch']}, no cache: CPU us/text "
                     "client / Triton, texts/s, max |served difference| vs the python head")
        for name, row in paths["paths"].items():
            lines.append(f"  {name:<20} {row['client_cpu_us_per_text']:>8} / {row['triton_cpu_us_per_text']!s:>8}"
                         f"  {row['texts_per_s']:>8}  {paths['max_abs_diff_vs_worker_python_head'][name]:.1e}")
    return "\n".join(lines)
