"""`modpipe bench` (no target): the end-to-end comparison, three paths in one run.

On the same machine, in one run, on the same texts (posts of a seeded `simulation.simulator` simulation built
from the served build's held-out split):

1. **pipeline**: modpipe end to end (broker -> ingest -> feature stages -> batching -> Triton ->
   decisions) on a local stack of N worker processes, the text cache off so that every text is
   computed, as the ceiling computes it. Saturation: every post is produced up front and decisions/s
   are measured over the steady part (the first and last 10% of decisions left out: pipeline fill and
   drain). Then the end-to-end latency (produce() call -> decision published, the decision record's
   timestamp; see `DecisionLog`) at a low fixed rate (`low_rate`, 5 posts/s) and at `load` x the
   saturation rate (Poisson or constant arrivals), on the same texts with fresh ids. Last, the workers
   restart with the text cache on and the saturation pass runs again: what campaigns' repeated texts
   save (hit ratio and posts/s).
2. **seed**: the approach modpipe replaces: one synchronous gRPC request per post to the same Triton
   server, inputs padded to 128 tokens, batch 1, tokenization in the loop (the workers are stopped
   first, so the seed has the machine the pipeline had).
3. **ceiling**: in-process ONNX Runtime on the same model file with Triton's thread settings, per-batch
   padding, tokenization in the loop, the best of a few batch sizes (Triton stopped first).

The ratios `pipeline/seed` and `pipeline/ceiling` are checked against the targets of the issue. The
report also says where the pipeline's CPU went (per process group, from /proc) and how busy the
machine was with other work in each phase: the numbers of a shared machine mean little without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import platform
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from loadgen.traffic import ProduceStats, arrival_times, make_producer, produce_events
from modpipe import log, schema
from modpipe.settings import Settings
from modpipe.textmodel.artifacts import ModelBuild, resolve_model
from modpipe.textmodel.tokenize import BatchTokenizer
from simulation.metrics import latency_summary, percentile
from simulation.simulator import Event, Simulation

_log = log.get(__name__)

# Issue #12's targets on the 2-core embedded stack: (direction, goal); "max": the value must not exceed it.
TARGETS = {
    "worker_cpu_ms_per_post": ("max", 1.0),        # at saturation, workers summed
    "broker_cpu_ms_per_post": ("max", 1.5),
    "pipeline_over_sorted_ceiling": ("min", 0.9),  # the text model on CPU, every text computed (cache off)
    "low_rate_p50_ms": ("max", 50.0),              # at 5 posts/s
    "low_rate_p99_ms": ("max", 150.0),
    "load_p99_ms": ("max", 300.0),                 # at 50% of saturation
}
# What one GPU serves at the worker's request shape (64 texts, 2 in flight): Triton 2.51 on an H100, python
# backend running the served model shape in PyTorch fp16, measured by another session (FIELD-NOTES section 5).
# Not measured by this benchmark; it sizes the capacity line (worker cores per GPU).
GPU_TEXTS_PER_S_REFERENCE = 17_900
DEFAULT_POSTS = 400
DEFAULT_LOAD = 0.5
DEFAULT_LOW_RATE = 5.0
DEFAULT_LOW_POSTS = 150
TEXT_CACHE_ON = 100_000  # MODPIPE_TEXT_CACHE_SIZE of the last pass (the pipeline's default)
DEFAULT_CEILING_BATCHES = (8, 16, 32, 64)
SEED_PAD = 128  # the seed padded every input to 128 tokens
STEADY_TRIM = 0.1  # fraction of decisions left out at each end of the saturation pass
UNTRIMMED_PROBE = 48
SHARED_CORES = 0.25  # other processes using more than this many cores in a phase: the machine was shared  # texts of the batch-1 width-128 compute probe (every row costs the same)


class BenchError(RuntimeError):
    """The benchmark could not measure (a post got no decision, a worker died)."""


# ---------------------------------------------------------------------------------------------- pure helpers

def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    return round(a / b, digits) if a and b else None


def saturation_rates(produce_started: float, received: Sequence[float], trim: float = STEADY_TRIM) -> dict:
    """Decisions/s of a pass where every post was produced at `produce_started`.

    `overall`: all decisions over first produce -> last decision (includes fill and drain).
    `steady`: decisions completed in (t_a, t_b] / (t_b - t_a), t_a and t_b the receive times of the
    decisions at `trim` and `1 - trim` of the run: an interval count, so decisions arriving in batches do
    not bias it. None when the window is empty (a tiny run decided in one or two batches)."""
    r = sorted(received)
    n = len(r)
    if not n:
        return {"overall": None, "steady": None, "steady_window_s": None, "steady_decisions": 0}
    overall = n / max(r[-1] - produce_started, 1e-9)
    t_a = r[min(n - 1, int(n * trim))]
    t_b = r[max(0, math.ceil(n * (1 - trim)) - 1)]
    count = sum(1 for x in r if t_a < x <= t_b)
    steady = count / (t_b - t_a) if count and t_b > t_a else None
    return {"overall": round(overall, 2), "steady": None if steady is None else round(steady, 2),
            "steady_window_s": round(t_b - t_a, 3), "steady_decisions": count}


def targets(measured: dict) -> dict:
    """Each target with its measured value and whether it is met (a missing value is not)."""
    out = {}
    for name, (direction, goal) in TARGETS.items():
        value = measured.get(name)
        met = value is not None and (value <= goal if direction == "max" else value >= goal)
        out[name] = {"target": goal, "direction": direction, "value": value, "met": met}
    return out


def capacity(worker_cpu_ms_per_post: float | None, gpu_texts_per_s: float = GPU_TEXTS_PER_S_REFERENCE) -> dict:
    """Posts/s one worker core can feed at the measured CPU per post, and the worker cores one GPU needs."""
    if not worker_cpu_ms_per_post:
        return {"posts_per_worker_core_s": None, "gpu_texts_per_s_reference": gpu_texts_per_s,
                "worker_cores_per_gpu": None}
    per_core = 1000.0 / worker_cpu_ms_per_post
    return {"posts_per_worker_core_s": round(per_core, 1), "gpu_texts_per_s_reference": gpu_texts_per_s,
            "worker_cores_per_gpu": round(gpu_texts_per_s / per_core, 1)}


# ---------------------------------------------------------------------------------------------- machine

def _clock_tick() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100


def machine_cpu_seconds() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat; None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = _clock_tick()
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (total - idle) / tick, total / tick


def group_cpu_seconds(groups: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) of the live processes of each process group {name: pgid}."""
    by_pgid = {pgid: name for name, pgid in groups.items() if pgid}
    out = dict.fromkeys(groups, 0.0)
    tick = _clock_tick()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    data = f.read()
            except OSError:
                continue
            rest = data[data.rindex(")") + 2:].split()  # state ppid pgrp ... utime(11) stime(12)
            name = by_pgid.get(int(rest[2]))
            if name is not None:
                out[name] += (int(rest[11]) + int(rest[12])) / tick
    return out


class CpuMeter:
    """CPU used during one phase: by each of our process groups, by this process, by the whole machine."""

    def __init__(self, groups: dict[str, int] | None = None):
        self.groups = dict(groups or {})
        self.t0 = time.monotonic()
        self.self0 = _self_cpu()
        self.groups0 = group_cpu_seconds(self.groups)
        self.machine0 = machine_cpu_seconds()
        self.load0 = _loadavg()

    def stop(self) -> dict:
        wall = max(time.monotonic() - self.t0, 1e-9)
        ours = {name: v - self.groups0.get(name, 0.0) for name, v in group_cpu_seconds(self.groups).items()}
        ours["bench_client"] = _self_cpu() - self.self0
        out = {"wall_s": round(wall, 2), "cpu_s": {k: round(v, 2) for k, v in ours.items()},
               "loadavg_1m_start": self.load0}
        machine1 = machine_cpu_seconds()
        if self.machine0 and machine1:
            busy = machine1[0] - self.machine0[0]
            out["machine_busy_cores"] = round(busy / wall, 2)
            out["own_cores"] = round(sum(ours.values()) / wall, 2)
            # what other users of the machine took meanwhile (never below 0: the counters differ in timing)
            out["other_cores"] = round(max(0.0, busy - sum(ours.values())) / wall, 2)
        return out


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine_info() -> dict:
    import onnxruntime

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    model_name = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem_kib = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem_gib = round(mem_kib / 2 ** 20, 1)
    return {"cpu_count": os.cpu_count(), "cpus_usable": affinity, "cpu_model": model_name, "memory_gib": mem_gib,
            "gpu": None, "platform": platform.platform(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "loadavg_1m_start": _loadavg()}


# ---------------------------------------------------------------------------------------------- texts

def bench_posts(texts: list[dict], n: int, run_id: str, scenario: str = "mixed", seed: int = 0) -> list[Event]:
    """The first `n` posts (no side events) of a seeded simulation. The same (texts, n, scenario, seed)
    give the same texts, users and links whatever `run_id` is; the ids differ."""
    sim = Simulation(texts, scenario, seed, start_ms=int(time.time() * 1000), run_id=run_id)
    # one post per arrival; the side events the posts cause (reports, shares, ...) are left out
    posts = [ev for ev in sim.events(k / 50.0 for k in range(n)) if ev.kind == "post"]
    assert len(posts) == n
    return posts


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


# ---------------------------------------------------------------------------------------------- Triton

def triton_quiet(url: str, model: str, quiet_s: float, timeout_s: float, poll_s: float = 0.25) -> float:
    """Wait until `model`'s inference count has not moved for `quiet_s` (or `timeout_s`); returns the wait."""
    started = time.monotonic()
    last, since = None, time.monotonic()
    while time.monotonic() - started < timeout_s:
        count = triton_stats(url, model)["inferences"]
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(poll_s)
    return time.monotonic() - started


def triton_stats(url: str, model: str) -> dict:
    """Cumulative statistics of `model` in the server: requests, executions (server batches), compute time."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        stats = client.get_inference_statistics(model, as_json=True).get("model_stats", [])
    finally:
        client.close()
    out = {"inferences": 0, "executions": 0, "requests": 0, "compute_s": 0.0, "queue_s": 0.0}
    for st in stats:
        inf = st.get("inference_stats", {})
        out["inferences"] += int(st.get("inference_count", 0))
        out["executions"] += int(st.get("execution_count", 0))
        out["requests"] += int(inf.get("success", {}).get("count", 0))
        out["compute_s"] += int(inf.get("compute_infer", {}).get("ns", 0)) / 1e9
        out["queue_s"] += int(inf.get("queue", {}).get("ns", 0)) / 1e9
    return out


def stats_delta(before: dict, after: dict, wall_s: float) -> dict:
    d = {k: after[k] - before[k] for k in before}
    return {"requests": d["requests"], "rows": d["inferences"], "executions": d["executions"],
            "avg_server_batch": round(d["inferences"] / d["executions"], 2) if d["executions"] else None,
            "model_compute_s": round(d["compute_s"], 2), "queue_s": round(d["queue_s"], 2),
            "model_busy_share": round(d["compute_s"] / wall_s, 3) if wall_s > 0 else None}


def triton_server_info(url: str, model: str) -> dict:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        meta = client.get_server_metadata(as_json=True)
        config = client.get_model_config(model, as_json=True)["config"]
    finally:
        client.close()
    params = config.get("parameters", {})
    return {"triton_version": meta.get("version"), "model": model,
            "build_version": params.get("build_version", {}).get("string_value"),
            "trim_padding": params.get("trim_padding", {}).get("string_value"),
            "intra_op_threads": params.get("intra_op_threads", {}).get("string_value"),
            "max_batch_size": config.get("max_batch_size")}


# ---------------------------------------------------------------------------------------------- seed and ceiling

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


# ---------------------------------------------------------------------------------------------- pipeline

class DecisionLog:
    """This run's decisions, read from the decisions topic only once they are all there.

    The embedded broker (noida-db) answers an empty fetch at once instead of waiting `fetch.wait.max.ms`,
    so a consumer left assigned to an idle topic spins: about half a core in the client and a third in
    the broker (measured). A live collector would take that from the pipeline it measures. Instead,
    completion is watched through the high watermarks (a few ListOffsets requests per second) and the
    records are fetched in one go at the end; a decision's time is its record timestamp, set by the
    worker's producer when it publishes the decision (a consumer on this machine sees it milliseconds
    later)."""

    def __init__(self, settings: Settings, bootstrap: str, topic: str, prefix: str):
        from confluent_kafka import Consumer, TopicPartition

        self._tp = TopicPartition
        self.topic, self.prefix = topic, prefix
        self.consumer = Consumer({**settings.kafka_client_config(), "bootstrap.servers": bootstrap,
                                  "group.id": f"modpipe-bench-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
        meta = self.consumer.list_topics(topic, timeout=10).topics[topic]
        self.partitions = sorted(meta.partitions)
        self.read_to = self.highs()  # everything before this run is skipped
        self.decided: dict[str, float] = {}  # post_id -> wall time (s) of its first decision
        self.records = 0

    def highs(self) -> dict[int, int]:
        return {p: self.consumer.get_watermark_offsets(self._tp(self.topic, p), timeout=10)[1] for p in self.partitions}

    def _read(self, highs: dict[int, int]) -> None:
        todo = {p: h for p, h in highs.items() if h > self.read_to[p]}
        if not todo:
            return
        self.consumer.assign([self._tp(self.topic, p, self.read_to[p]) for p in todo])
        deadline = time.monotonic() + 60
        try:
            while todo and time.monotonic() < deadline:
                for msg in self.consumer.consume(1000, 0.5):
                    if msg.error():
                        continue
                    p = msg.partition()
                    self.read_to[p] = msg.offset() + 1
                    if p in todo and self.read_to[p] >= todo[p]:
                        del todo[p]
                    self.records += 1
                    try:
                        pid = schema.decode_decision(msg.value())["post_id"]
                    except schema.InvalidMessage:
                        continue
                    if pid.startswith(self.prefix):
                        _, ts_ms = msg.timestamp()
                        self.decided.setdefault(pid, ts_ms / 1000.0)
        finally:
            self.consumer.unassign()

    def wait(self, wanted: set[str], timeout_s: float, healthy: Callable[[], bool], bar=None) -> dict[str, float]:
        """{post_id: decision time} for every post of `wanted`; BenchError when some stay undecided."""
        deadline = time.monotonic() + timeout_s
        shown = 0
        while True:
            missing = len(wanted) - sum(1 for pid in wanted if pid in self.decided)
            highs = self.highs()
            new = sum(h - self.read_to[p] for p, h in highs.items())
            if bar is not None:
                now = min(len(wanted), len(wanted) - missing + new)
                bar.update(now - shown)
                shown = now
            if new >= missing or time.monotonic() >= deadline:
                self._read(highs)
                if all(pid in self.decided for pid in wanted):
                    return {pid: self.decided[pid] for pid in wanted}
                if time.monotonic() >= deadline:
                    got = sum(1 for pid in wanted if pid in self.decided)
                    raise BenchError(f"{len(wanted) - got} of {len(wanted)} posts got no decision in {timeout_s:.0f} s")
            if not healthy():
                raise BenchError("a worker exited during the benchmark; see its log")
            time.sleep(0.25)  # decision times come from the records: polling less often only ends later

    def close(self) -> None:
        self.consumer.close()


def _produce(settings: Settings, producer, events: list[Event], bar=None) -> ProduceStats:
    stats = produce_events(producer, settings, events, stats=ProduceStats(), progress=bar)
    if producer.flush(60) != 0 or stats.delivery_errors:
        raise BenchError("not every post was delivered to the broker")
    return stats


def _worker_metrics(before: dict[str, float], after: dict[str, float]) -> dict:
    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    batches = delta("modpipe_batch_size_posts_count")
    requests = delta("modpipe_triton_request_duration_seconds_count")
    hits, misses = delta("modpipe_text_cache_requests_total{result=hit}"), delta(
        "modpipe_text_cache_requests_total{result=miss}")
    return {"batches": int(batches),
            "avg_batch": round(delta("modpipe_batch_size_posts_sum") / batches, 2) if batches else None,
            "triton_request_mean_ms": round(1000 * delta("modpipe_triton_request_duration_seconds_sum") / requests, 1)
            if requests else None,
            "text_cache_hit_ratio": round(hits / (hits + misses), 3) if hits + misses else None,
            "local_hops": int(sum(after.get(k, 0.0) - before.get(k, 0.0) for k in after
                                  if k.startswith("modpipe_local_hops_total")))}


def _stack_groups(stack) -> dict[str, int]:
    groups = {w.name: w.process.pid for w in stack.workers if w.process.pid}
    if stack.triton is not None and stack.triton.pid:
        groups["triton"] = stack.triton.pid
    if stack.broker is not None and stack.broker.process is not None:
        groups["broker"] = stack.broker.process.pid
    return groups


def _where_time_goes(cpu: dict, n_posts: int, worker_names: Sequence[str]) -> dict:
    """CPU milliseconds per post by component (workers summed)."""
    cpu_s = dict(cpu["cpu_s"])
    per = {"workers": sum(cpu_s.pop(name, 0.0) for name in worker_names)}
    per.update(cpu_s)
    return {k: round(1000 * v / n_posts, 1) for k, v in per.items()}


def saturation_pass(settings: Settings, stack, producer, events: list[Event], *, timeout_s: float,
                    decisions: DecisionLog, progress: bool, healthy: Callable[[], bool], label: str) -> dict:
    """Every post produced up front; decisions/s over the steady part and where the CPU went."""
    from tqdm import tqdm

    groups = _stack_groups(stack)
    metrics0, triton0 = stack.scrape(), triton_stats(stack.triton_url, settings.triton_model)
    cpu = CpuMeter(groups)
    t0 = time.perf_counter()
    stats = _produce(settings, producer, [ev._replace(offset_s=0.0) for ev in events])
    with tqdm(total=len(events), desc=label, unit="post", disable=not progress) as bar:
        decided = decisions.wait(set(stats.sent_at), timeout_s, healthy, bar)
    wall = time.perf_counter() - t0
    cpu_sat = cpu.stop()
    rates = saturation_rates(stats.started, list(decided.values()))
    sat_latency = [(t - stats.sent_at[pid]) * 1000 for pid, t in decided.items()]
    return {
        "posts": len(events), "wall_s": round(wall, 2), "posts_per_s": rates["steady"] or rates["overall"],
        "posts_per_s_steady": rates["steady"], "posts_per_s_overall": rates["overall"],
        "steady_window_s": rates["steady_window_s"], "rate_used": "steady" if rates["steady"] else "overall",
        "time_to_last_decision_s": round(max(decided.values()) - stats.started, 2),
        "queueing_latency_p50_ms": round(percentile(sat_latency, 50), 1),
        "workers": _worker_metrics(metrics0, stack.scrape()),
        "triton": stats_delta(triton0, triton_stats(stack.triton_url, settings.triton_model), wall),
        "cpu": cpu_sat,
        "cpu_ms_per_post": _where_time_goes(cpu_sat, len(events), [w.name for w in stack.workers]),
    }


def latency_pass(settings: Settings, stack, producer, events: list[Event], rate: float, *, arrivals: str,
                 seed: int, timeout_s: float, decisions: DecisionLog, progress: bool,
                 healthy: Callable[[], bool], label: str) -> dict:
    """Posts arriving at `rate` per second: end-to-end latency, produce() call -> decision published."""
    from tqdm import tqdm

    times = list(arrival_times(arrivals, rate, count=len(events), seed=seed))
    events = [ev._replace(offset_s=t) for ev, t in zip(events, times, strict=True)]
    metrics0 = stack.scrape()
    cpu = CpuMeter(_stack_groups(stack))
    with tqdm(total=len(events), desc=label, unit="post", disable=not progress) as bar:
        stats = _produce(settings, producer, events, bar)
    decided = decisions.wait(set(stats.sent_at), timeout_s, healthy)
    cpu_lat = cpu.stop()
    latencies = [(t - stats.sent_at[pid]) * 1000 for pid, t in decided.items()]
    last = max(decided.values())
    lat = latency_summary(latencies)
    return {
        "arrivals": arrivals, "posts": len(events), "offered_posts_per_s": round(rate, 2),
        "produced_posts_per_s": round(len(events) / max(stats.finished - stats.started, 1e-9), 2),
        "decided_posts_per_s": round(len(events) / max(last - stats.started, 1e-9), 2),
        "drain_s": round(max(0.0, last - stats.finished), 2),
        **{k: lat[k] for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms")},
        "latency_is": "produce() call -> decision record published by the worker",
        "workers": _worker_metrics(metrics0, stack.scrape()),
        "cpu": cpu_lat,
    }


def pipeline_passes(settings: Settings, stack, warmup: list[Event], saturation: list[Event],
                    latency_events: list[Event], low_events: list[Event], cached_events: list[Event], *,
                    load: float, low_rate: float, arrivals: str, seed: int, timeout_s: float,
                    decisions: DecisionLog, progress: bool, idle_s: float = 3.0) -> dict:
    """The pipeline's passes (see the module docstring). The stack's workers run with the text cache off;
    they are restarted with it on for the last pass."""

    def healthy() -> bool:
        return all(w.process.alive() for w in stack.workers)

    common = {"timeout_s": timeout_s, "decisions": decisions, "progress": progress, "healthy": healthy}
    producer = make_producer(settings, stack.bootstrap)
    # warm-up: first Triton connection, table stores, consumer fetch sessions; not measured
    stats = _produce(settings, producer, [ev._replace(offset_s=0.0) for ev in warmup])
    decisions.wait(set(stats.sent_at), timeout_s, healthy)

    # what the stack burns with nothing to do (on noida-db, idle consumers poll empty fetches)
    cpu = CpuMeter(_stack_groups(stack))
    time.sleep(idle_s)
    idle = cpu.stop()
    idle_cores = {k: round(v / idle["wall_s"], 2) for k, v in idle["cpu_s"].items()}

    sat = saturation_pass(settings, stack, producer, saturation, label="pipeline saturation", **common)
    sat["idle_cores"] = idle_cores
    low = latency_pass(settings, stack, producer, low_events, low_rate, arrivals=arrivals, seed=seed,
                       label=f"pipeline at {low_rate:g} posts/s", **common)
    offered = round(load * sat["posts_per_s"], 2)
    lat = latency_pass(settings, stack, producer, latency_events, offered, arrivals=arrivals, seed=seed,
                       label=f"pipeline at {load:.0%}", **common)
    lat["load"] = load

    # the same saturation pass with the text cache on (fresh workers, an empty cache)
    for w in stack.workers:
        w.process.stop(timeout=20)
    stack.extra_env["MODPIPE_TEXT_CACHE_SIZE"] = str(TEXT_CACHE_ON)
    for i in range(len(stack.workers)):
        stack.start_worker(i)
    stack.wait_workers_ready()
    stats = _produce(settings, producer, [ev._replace(offset_s=0.0) for ev in warmup[: max(1, len(warmup) // 4)]])
    decisions.wait(set(stats.sent_at), timeout_s, healthy)
    # Restarted workers first decide again what the last pass left uncommitted (at-least-once); those texts
    # are not this pass's: wait until Triton has computed nothing for a while before the pass begins.
    triton_quiet(stack.triton_url, settings.triton_model, quiet_s=max(2.0, 2 * idle_s), timeout_s=timeout_s)
    cached = saturation_pass(settings, stack, producer, cached_events, label="pipeline saturation, text cache on",
                             **common)
    return {"posts_per_s": sat["posts_per_s"], "saturation": sat, "low_rate": low, "latency": lat,
            "saturation_text_cache": cached}


def isolated_settings(settings: Settings, build: ModelBuild, name: str, state_root: Path) -> Settings:
    """Own topics (prefix `<name>.`), group, state dir and ports: a run never meets `modpipe up` or another run."""
    from modpipe.services.process import free_port

    changes: dict = {"state_dir": state_root, "model_dir": str(build.path),
                     "topic_prefix": f"{settings.topic_prefix}{name}.", "app_id": f"{settings.app_id}-{name}",
                     "metrics_port": free_port(), "web_port": free_port(), "text_model": "on"}
    if not settings.bootstrap_servers:
        changes["broker_port"] = free_port()
    if not settings.triton_url:
        changes.update(triton_http_port=free_port(), triton_grpc_port=free_port(), triton_metrics_port=free_port())
    return dataclasses.replace(settings, **changes)


def run(settings: Settings, n_posts: int = DEFAULT_POSTS, workers: int | None = None, *, load: float = DEFAULT_LOAD,
        low_rate: float = DEFAULT_LOW_RATE, low_posts: int = DEFAULT_LOW_POSTS,
        arrivals: str = "poisson", scenario: str = "mixed", seed: int = 0,
        ceiling_batch_sizes: Sequence[int] = DEFAULT_CEILING_BATCHES, warmup_posts: int = 20,
        timeout_s: float = 300.0, progress: bool = True, keep_state: bool = False, idle_s: float = 3.0,
        untrimmed_texts: int = UNTRIMMED_PROBE) -> dict:
    """Run the three paths and return the report (see the module docstring)."""
    from tqdm import tqdm

    from streams.stack import LocalStack

    if n_posts < 10:
        raise ValueError("--posts must be at least 10")
    if not 0 < load <= 1:
        raise ValueError("--load must be in (0, 1]")
    workers = workers or settings.workers
    build = resolve_model(settings)
    texts = build.heldout()
    tag = uuid.uuid4().hex[:6]
    run_id = f"bench{tag}"
    warmup = bench_posts(texts, warmup_posts, f"{run_id}-w", scenario, seed + 1)
    saturation = bench_posts(texts, n_posts, f"{run_id}-s", scenario, seed)
    latency_events = bench_posts(texts, n_posts, f"{run_id}-l", scenario, seed)
    low_events = bench_posts(texts, low_posts, f"{run_id}-r", scenario, seed)
    cached_events = bench_posts(texts, n_posts, f"{run_id}-c", scenario, seed)
    post_texts = [ev.payload["text"] for ev in saturation]
    for other in (latency_events, cached_events):
        if post_texts != [ev.payload["text"] for ev in other]:
            raise BenchError("a pipeline pass would not use the saturation pass's texts")  # a Simulation change
    tok = BatchTokenizer.for_build(build)
    lengths = [len(ids) for ids in tok.ids(post_texts)]

    state_root = settings.state_dir / "bench" / f"e2e-{tag}"
    settings = isolated_settings(settings, build, f"bench{tag}", state_root)
    info = machine_info()
    options = ort_options()
    report: dict = {
        "config": {"posts": n_posts, "workers": workers, "scenario": scenario, "seed": seed, "load": load,
                   "low_rate": low_rate, "low_posts": low_posts, "local_hops": settings.local_hops,
                   "arrivals": arrivals, "warmup_posts": warmup_posts, "max_batch": settings.max_batch,
                   "max_wait_ms": settings.max_wait_ms, "max_inflight": settings.max_inflight,
                   "partitions": settings.partitions, "table_store": settings.table_store,
                   "ceiling_batch_sizes": list(ceiling_batch_sizes)},
        "machine": info,
        "texts": {"posts": n_posts, "distinct": len(set(post_texts)),
                  "spam_share": round(sum(ev.truth["text_label"] == "spam" for ev in saturation) / n_posts, 3),
                  "tokens_mean": round(float(np.mean(lengths)), 1), "tokens_p50": float(np.median(lengths)),
                  "at_max_len_share": round(sum(n >= build.max_seq_len for n in lengths) / n_posts, 3)},
    }
    ok = False
    try:
        _log.info("bench: starting the stack", extra={"workers": workers, "posts": n_posts, "state": str(state_root)})
        # every text computed, as the ceiling computes it; the last pass turns the cache on
        with LocalStack(settings, workers=workers, extra_env={"MODPIPE_TEXT_CACHE_SIZE": "0"}) as stack:
            server = triton_server_info(stack.triton_url, settings.triton_model)
            report["model"] = {"build_version": build.version, "build_path": str(build.path),
                               "precision": build.served.get("precision"), "max_seq_len": build.max_seq_len,
                               "served_by_triton": server, "ort": options}
            if server.get("build_version") not in (None, build.version):
                _log.warning("Triton serves another build than the ceiling runs",
                             extra={"triton": server.get("build_version"), "ceiling": build.version})
            decisions = DecisionLog(settings, stack.bootstrap, stack.topics.decisions, f"{run_id}-")
            try:
                _log.info("bench: pipeline")
                report["pipeline"] = pipeline_passes(
                    settings, stack, warmup, saturation, latency_events, low_events, cached_events, load=load,
                    low_rate=low_rate, arrivals=arrivals, seed=seed, timeout_s=timeout_s, decisions=decisions,
                    progress=progress, idle_s=idle_s)
            finally:
                decisions.close()
            for w in stack.workers:  # the seed gets the machine to itself (with its Triton)
                w.process.stop(timeout=20)
            _log.info("bench: seed")
            groups = {"triton": stack.triton.pid} if stack.triton is not None else {}
            cpu = CpuMeter(groups)
            with tqdm(total=n_posts, desc="seed (batch 1, width 128)", unit="post", disable=not progress) as bar:
                report["seed"] = seed_pass(stack.triton_url, settings.triton_model, tok, post_texts, bar.update)
            report["seed"]["cpu"] = cpu.stop()
        _log.info("bench: ceiling")
        session = ort_session(build.onnx, options)
        cpu = CpuMeter()
        with tqdm(total=n_posts * len(ceiling_batch_sizes), desc="ceiling (in-process ORT)", unit="post",
                  disable=not progress) as bar:
            report["ceiling"] = ceiling_pass(session, tok, post_texts, ceiling_batch_sizes, bar.update)
        report["ceiling"]["cpu"] = cpu.stop()
        report["ceiling"]["threads"] = int(options["intra_op_threads"])
        # A stricter bound than the ceiling: an offline job may sort every text by length first,
        # so that no batch pays for padding. Reported beside it; the target stays on the ceiling.
        by_length = [post_texts[i] for i in np.argsort(lengths, kind="stable")]
        with tqdm(total=n_posts * len(ceiling_batch_sizes), desc="ceiling, texts sorted by length", unit="post",
                  disable=not progress) as bar:
            report["ceiling_sorted"] = ceiling_pass(session, tok, by_length, ceiling_batch_sizes, bar.update)
        report["seed"]["untrimmed_compute"] = untrimmed_probe(session, tok, post_texts[:untrimmed_texts])
        ok = True
    finally:
        if not keep_state and ok:
            shutil.rmtree(state_root, ignore_errors=True)
        elif not ok:
            _log.error("bench failed; logs kept", extra={"logs": str(state_root / "logs")})
    p = report["pipeline"]
    pipe, seed_r, ceil = p["posts_per_s"], report["seed"]["posts_per_s"], report["ceiling"]["posts_per_s"]
    sorted_ceil = report["ceiling_sorted"]["posts_per_s"]
    report["ratios"] = {"pipeline_over_seed": ratio(pipe, seed_r), "pipeline_over_ceiling": ratio(pipe, ceil),
                        "seed_over_ceiling": ratio(seed_r, ceil),
                        "pipeline_over_sorted_ceiling": ratio(pipe, sorted_ceil),
                        "pipeline_text_cache_over_sorted_ceiling": ratio(p["saturation_text_cache"]["posts_per_s"],
                                                                         sorted_ceil)}
    per_post = p["saturation"]["cpu_ms_per_post"]
    measured = {**report["ratios"], "worker_cpu_ms_per_post": per_post.get("workers"),
                "broker_cpu_ms_per_post": per_post.get("broker"),
                "low_rate_p50_ms": p["low_rate"]["p50_ms"], "low_rate_p99_ms": p["low_rate"]["p99_ms"],
                "load_p99_ms": p["latency"]["p99_ms"]}
    report["targets"] = targets(measured)
    report["all_targets_met"] = all(t["met"] for t in report["targets"].values())
    report["capacity"] = capacity(per_post.get("workers"))
    phases = {"pipeline_saturation": p["saturation"]["cpu"], "pipeline_low_rate": p["low_rate"]["cpu"],
              "pipeline_latency": p["latency"]["cpu"], "pipeline_text_cache": p["saturation_text_cache"]["cpu"],
              "seed": report["seed"]["cpu"], "ceiling": report["ceiling"]["cpu"]}
    others = {k: v.get("other_cores") for k, v in phases.items()}
    report["machine"]["other_cores_by_phase"] = others
    # another user of the machine took a noticeable share in some phase: the ratios compare unequal conditions
    report["machine"]["shared"] = any(v is not None and v > SHARED_CORES for v in others.values())
    report["machine"]["loadavg_1m_end"] = _loadavg()
    return report


# ---------------------------------------------------------------------------------------------- rendering

def _f(x, digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


TARGET_LABELS = {
    "worker_cpu_ms_per_post": ("worker CPU per post at saturation (ms)", 2),
    "broker_cpu_ms_per_post": ("broker CPU per post at saturation (ms)", 2),
    "pipeline_over_sorted_ceiling": ("pipeline / sorted ceiling (text model on CPU)", 2),
    "low_rate_p50_ms": ("p50 at 5 posts/s (ms)", 0),
    "low_rate_p99_ms": ("p99 at 5 posts/s (ms)", 0),
    "load_p99_ms": ("p99 at 50% of saturation (ms)", 0),
}


def format_markdown(report: dict) -> str:
    cfg, m = report["config"], report["machine"]
    pipe, seed, ceil = report["pipeline"], report["seed"], report["ceiling"]
    sorted_ceil = report["ceiling_sorted"]
    sat, low, lat, cached = pipe["saturation"], pipe["low_rate"], pipe["latency"], pipe["saturation_text_cache"]
    workers = f"{cfg['workers']} worker{'s' if cfg['workers'] != 1 else ''}"
    lines = [
        "| path | what | posts/s | p50 ms | p99 ms |",
        "|---|---|---:|---:|---:|",
        f"| **pipeline**, saturation | all {cfg['posts']} posts produced at once; broker -> ingest + feature stages "
        f"-> Triton batches (avg {_f(sat['workers']['avg_batch'])}) -> decisions, {workers}, text cache off | "
        f"**{_f(pipe['posts_per_s'])}** | | |",
        f"| pipeline, text cache on | the same posts again (fresh ids), fresh workers with the text cache: "
        f"{_f(100 * (cached['workers']['text_cache_hit_ratio'] or 0), 0)}% of texts from the cache | "
        f"{_f(cached['posts_per_s'])} | | |",
        f"| pipeline at {_f(low['offered_posts_per_s'], 0)} posts/s | {low['arrivals']} arrivals, {low['posts']} posts; "
        f"produce -> decision published | {_f(low['decided_posts_per_s'])} | **{_f(low['p50_ms'], 0)}** | "
        f"**{_f(low['p99_ms'], 0)}** |",
        f"| pipeline at {cfg['load']:.0%} load | {lat['arrivals']} arrivals at {_f(lat['offered_posts_per_s'])}/s | "
        f"{_f(lat['decided_posts_per_s'])} | {_f(lat['p50_ms'], 0)} | **{_f(lat['p99_ms'], 0)}** |",
        f"| **seed** | one blocking gRPC request per post to the same Triton, batch 1, padded to {seed['width']} | "
        f"**{_f(seed['posts_per_s'])}** | {_f(seed['p50_ms'])} | {_f(seed['p99_ms'])} |",
        f"| **ceiling** | in-process ONNX Runtime, same model file, {ceil['threads']} threads, batch "
        f"{ceil['best_batch']} (best of {', '.join(str(r['batch']) for r in ceil['by_batch'])}), per-batch padding "
        f"| **{_f(ceil['posts_per_s'])}** | | |",
        f"| ceiling, sorted | the same, texts sorted by length first (an offline bound: no batch pays for "
        f"padding), batch {sorted_ceil['best_batch']} | **{_f(sorted_ceil['posts_per_s'])}** | | |",
        "",
        "| target | measured | goal | met |",
        "|---|---:|---:|---|",
    ]
    for name, t in report["targets"].items():
        label, digits = TARGET_LABELS.get(name, (name, 2))
        sign = "<=" if t["direction"] == "max" else ">="
        lines.append(f"| {label} | **{_f(t['value'], digits)}** | {sign} {t['target']:g} | "
                     f"{'yes' if t['met'] else 'no'} |")
    r = report["ratios"]
    per = sat["cpu_ms_per_post"]
    cap = report["capacity"]
    lines += [
        "",
        f"Other ratios: pipeline / seed {_f(r['pipeline_over_seed'], 2)}, pipeline / ceiling "
        f"{_f(r['pipeline_over_ceiling'], 2)}, pipeline with the text cache / sorted ceiling "
        f"{_f(r['pipeline_text_cache_over_sorted_ceiling'], 2)}.",
        "CPU per post at saturation: " + ", ".join(f"{k} {_f(v, 2)} ms" for k, v in per.items()) + ".",
        f"Capacity: one worker core feeds {_f(cap['posts_per_worker_core_s'], 0)} posts/s at that CPU per post; "
        f"one GPU serving {cap['gpu_texts_per_s_reference']:,} texts/s at the worker's request shape (H100, "
        f"measured elsewhere, FIELD-NOTES section 5) needs {_f(cap['worker_cores_per_gpu'])} worker cores.",
    ]
    others = [v for v in m.get("other_cores_by_phase", {}).values() if v is not None]
    model = report.get("model", {})
    untrimmed = seed.get("untrimmed_compute", {}).get("posts_per_s")
    lines += [
        f"The seed's requests go to the same Triton, whose model computes each row only up to its last real "
        f"token: there its padding to {seed['width']} costs bytes, not compute. Computing the padding (batch 1 "
        f"at width {seed['width']}, ONNX Runtime in process, same threads, {seed.get('untrimmed_compute', {}).get('texts')} "
        f"texts): {_f(untrimmed)} posts/s.",
        f"Machine: {m['cpus_usable']} CPUs ({m['cpu_model'] or 'unknown'}), no GPU; model build "
        f"{model.get('build_version')} ({model.get('precision')}), {report['texts']['posts']} posts of the "
        f"`{cfg['scenario']}` simulation, {report['texts']['tokens_mean']} tokens/text on average. "
        + (f"Other processes used {min(others):.2f}-{max(others):.2f} cores during the phases "
           f"(load average {m['loadavg_1m_start']} at the start)"
           + (": the machine was shared, so the phases ran under different loads." if m.get("shared") else ".")
           if others else ""),
    ]
    return "\n".join(lines)


def format_text(report: dict) -> str:
    sat = report["pipeline"]["saturation"]
    tr = sat["triton"]
    notes = [
        "",
        f"pipeline saturation: steady {_f(sat['posts_per_s_steady'])}/s, overall {_f(sat['posts_per_s_overall'])}/s "
        f"({sat['posts']} posts in {sat['time_to_last_decision_s']} s); items applied without a Kafka hop: "
        f"{sat['workers']['local_hops']}",
        "idle stack (nothing to process), cores: " + ", ".join(f"{k} {v}" for k, v in sat["idle_cores"].items()),
        f"Triton during saturation: model busy {_f(100 * (tr['model_busy_share'] or 0), 0)}% of the time, "
        f"server batch {tr['avg_server_batch']}",
        "targets " + ("all met" if report["all_targets_met"] else "NOT all met: "
                      + ", ".join(k for k, t in report["targets"].items() if not t["met"])),
    ]
    return format_markdown(report) + "\n" + "\n".join(notes)


def write_markdown(report: dict, path: Path) -> Path:
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    path.write_text(f"<!-- modpipe bench, {when}; {' '.join(sys.argv[1:]) or 'run()'} -->\n"
                    + format_markdown(report) + "\n")
    return path
