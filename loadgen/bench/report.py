"""The end-to-end report's verdicts and rendering: ratios, the issue's targets, the capacity line, and the
markdown and text tables."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

# Targets on the 2-core embedded stack (issues #12 and #24; latency runs from each post's scheduled send time
# to a read_committed reader, so it includes the transaction commit): (direction, goal); "max": the value
# must not exceed it.
TARGETS = {
    "worker_cpu_ms_per_post": ("max", 1.0),        # at saturation, workers summed
    "broker_cpu_ms_per_post": ("max", 1.5),
    "pipeline_over_sorted_ceiling": ("min", 0.9),  # the text model on CPU, every text computed (cache off)
    "low_rate_p50_ms": ("max", 60.0),              # at 5 posts/s
    "low_rate_p99_ms": ("max", 200.0),
    "load_p99_ms": ("max", 300.0),                 # at 50% of saturation (or more)
}
# The load pass must offer at least this share of the run's own saturation rate for its p99 to count
# against load_p99_ms: a pass at 30% (`--load 0.3`, or a `--load-rate` below half) meets nothing.
TARGET_LOAD_SHARE = 0.5
# What one GPU serves at the worker's request shape (64 texts, 2 in flight): Triton 2.51 on an H100, python
# backend running the served model shape in PyTorch fp16 (docs/benchmarks.md, "One GPU"). Not measured by
# this benchmark; it sizes the capacity line (worker cores per GPU).
GPU_TEXTS_PER_S_REFERENCE = 17_900


def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
    return round(a / b, digits) if a and b else None

def load_offered(saturation_posts_per_s: float, load: float, load_rate: float | None = None) -> tuple[float, float]:
    """The load pass's rate and the share of the saturation rate it is: `load` x saturation, or the fixed
    `load_rate` (posts/s). A fixed rate offers the same posts/s to two runs whose saturation readings differ
    (they moved by 25% between back-to-back runs of the same code on 2 shared cores), so it compares code."""
    rate = round(load_rate if load_rate else load * saturation_posts_per_s, 2)
    return rate, (round(rate / saturation_posts_per_s, 3) if saturation_posts_per_s else 0.0)


def targets(measured: dict) -> dict:
    """Each target with its measured value and whether it is met (a missing value is not). `load_share`,
    the share of saturation the load pass offered, must reach TARGET_LOAD_SHARE for load_p99_ms to be met."""
    out = {}
    for name, (direction, goal) in TARGETS.items():
        value = measured.get(name)
        met = value is not None and (value <= goal if direction == "max" else value >= goal)
        out[name] = {"target": goal, "direction": direction, "value": value, "met": met}
    share = measured.get("load_share")
    out["load_p99_ms"]["load_share"] = share
    out["load_p99_ms"]["met"] &= share is not None and share >= TARGET_LOAD_SHARE - 0.005  # rates are rounded
    return out

# The GPU machine the capacity line sizes: an H200 with 16 cores (docs/benchmarks.md, "One GPU").
MACHINE_CORES = 16


def capacity(worker_cpu_ms_per_post: float | None, gpu_texts_per_s: float = GPU_TEXTS_PER_S_REFERENCE,
             cpu_ms_per_post: dict | None = None, machine_cores: int = MACHINE_CORES) -> dict:
    """Posts/s one worker core can feed at the measured CPU per post, and the worker cores one GPU needs; with
    `cpu_ms_per_post` ({process: ms}, as `pipeline._where_time_goes` gives it), posts/s per core of each process
    and what one GPU machine of `machine_cores` cores decides: the posts/s its cores or the GPU allow (the
    broker on machines of its own), and the workers (one core each: an event loop) and Triton cores for it."""
    if not worker_cpu_ms_per_post:
        return {"posts_per_worker_core_s": None, "gpu_texts_per_s_reference": gpu_texts_per_s,
                "worker_cores_per_gpu": None}
    per_core = 1000.0 / worker_cpu_ms_per_post
    out = {"posts_per_worker_core_s": round(per_core, 1), "gpu_texts_per_s_reference": gpu_texts_per_s,
           "worker_cores_per_gpu": round(gpu_texts_per_s / per_core, 1)}
    if cpu_ms_per_post:
        out["posts_per_core_s"] = {k: round(1000.0 / v, 1) for k, v in cpu_ms_per_post.items() if v}
        on_machine = worker_cpu_ms_per_post + (cpu_ms_per_post.get("triton") or 0.0)
        rate = min(gpu_texts_per_s, machine_cores * 1000.0 / on_machine)
        out["machine"] = {"cores": machine_cores, "posts_per_s": round(rate),
                          "limit": "gpu" if rate == gpu_texts_per_s else "cores",
                          "workers": math.ceil(rate * worker_cpu_ms_per_post / 1000.0 - 1e-9),
                          "triton_cores": math.ceil(rate * (cpu_ms_per_post.get("triton") or 0.0) / 1000.0 - 1e-9)}
    return out


def capacity_line(cap: dict) -> str:
    """The capacity in words (text and markdown reports)."""
    line = (f"Capacity: one worker core feeds {_f(cap['posts_per_worker_core_s'], 0)} posts/s at that CPU per post; "
            f"one GPU serving {cap['gpu_texts_per_s_reference']:,} texts/s at the worker's request shape (H100, "
            f"docs/benchmarks.md) needs {_f(cap['worker_cores_per_gpu'])} worker cores.")
    if cap.get("posts_per_core_s"):
        line += " Posts/s per core: " + ", ".join(f"{k} {_f(v, 0)}" for k, v in cap["posts_per_core_s"].items()) + "."
    m = cap.get("machine")
    if m:
        line += (f" A GPU machine of {m['cores']} cores (broker elsewhere) decides {_f(m['posts_per_s'], 0)} posts/s "
                 f"(its {'GPU' if m['limit'] == 'gpu' else 'cores'} the limit) with {m['workers']} workers and "
                 f"{m['triton_cores']} cores of Triton.")
    return line


def _f(x, digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def from_produce(p: dict) -> str:
    """A latency pass's p50 / p99 counted from the produce() call, beside the headline counted from the
    schedule: where they differ, posts waited for the producer."""
    q = p.get("from_produce")
    if not q:  # a report from before both were measured
        return ""
    return f"from produce(): {_f(q['p50_ms'], 0)} / {_f(q['p99_ms'], 0)} ms"

TARGET_LABELS = {
    "worker_cpu_ms_per_post": ("worker CPU per post at saturation (ms)", 2),
    "broker_cpu_ms_per_post": ("broker CPU per post at saturation (ms)", 2),
    "pipeline_over_sorted_ceiling": ("pipeline / sorted ceiling (text model on CPU)", 2),
    "low_rate_p50_ms": ("p50 at 5 posts/s (ms)", 0),
    "low_rate_p99_ms": ("p99 at 5 posts/s (ms)", 0),
    "load_p99_ms": ("p99 at 50% of saturation (ms)", 0),  # the label names the share the pass offered
}

def format_markdown(report: dict) -> str:
    cfg, m = report["config"], report["machine"]
    pipe, seed, ceil = report["pipeline"], report["seed"], report["ceiling"]
    sorted_ceil = report["ceiling_sorted"]
    sat, low, lat, cached = pipe["saturation"], pipe["low_rate"], pipe["latency"], pipe["saturation_text_cache"]
    workers = f"{cfg['workers']} worker{'s' if cfg['workers'] != 1 else ''}"
    base = cfg.get("baseline_posts") or cfg["posts"]
    sample = f" (the first {base} posts)" if base < cfg["posts"] else ""
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
        f"scheduled send -> decision visible (read_committed){_semi(from_produce(low))} | "
        f"{_f(low['decided_posts_per_s'])} | **{_f(low['p50_ms'], 0)}** | **{_f(low['p99_ms'], 0)}** |",
        f"| pipeline at {lat['load']:.0%} load | {lat['arrivals']} arrivals at {_f(lat['offered_posts_per_s'])}/s"
        f"{' (fixed rate)' if cfg.get('load_rate') else ''}{_semi(from_produce(lat))} | "
        f"{_f(lat['decided_posts_per_s'])} | {_f(lat['p50_ms'], 0)} | **{_f(lat['p99_ms'], 0)}** |",
        f"| **seed** | one blocking gRPC request per post to the same Triton, batch 1, padded to {seed['width']}{sample} | "
        f"**{_f(seed['posts_per_s'])}** | {_f(seed['p50_ms'])} | {_f(seed['p99_ms'])} |",
        f"| **ceiling** | in-process ONNX Runtime, same model file, {ceil['threads']} threads, batch "
        f"{ceil['best_batch']} (best of {', '.join(str(r['batch']) for r in ceil['by_batch'])}), per-batch padding"
        f"{sample} | **{_f(ceil['posts_per_s'])}** | | |",
        f"| ceiling, sorted | the same, texts sorted by length first (an offline bound: no batch pays for "
        f"padding), batch {sorted_ceil['best_batch']} | **{_f(sorted_ceil['posts_per_s'])}** | | |",
        "",
        "| target | measured | goal | met |",
        "|---|---:|---:|---|",
    ]
    for name, t in report["targets"].items():
        label, digits = TARGET_LABELS.get(name, (name, 2))
        if name == "load_p99_ms":
            label = f"p99 at {lat['offered_posts_per_s']:g} posts/s = {_f(100 * (t['load_share'] or 0), 0)}% of saturation (ms)"
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
        capacity_line(cap),
    ]
    others = [v for v in m.get("other_cores_by_phase", {}).values() if v is not None]
    model = report.get("model", {})
    untrimmed = seed.get("untrimmed_compute", {}).get("posts_per_s")
    lines += [
        f"The seed's requests go to the same Triton, whose model computes each row only up to its last real "
        f"token: there its padding to {seed['width']} costs bytes, not compute. Computing the padding (batch 1 "
        f"at width {seed['width']}, ONNX Runtime in process, same threads, {seed.get('untrimmed_compute', {}).get('texts')} "
        f"texts): {_f(untrimmed)} posts/s.",
        f"Machine: {m['cpus_usable']} CPUs ({m['cpu_model'] or 'unknown'}), {_gpu(m, cfg)}; model build "
        f"{model.get('build_version')} ({model.get('precision')}), {report['texts']['posts']} posts of the "
        f"`{cfg['scenario']}` simulation, {report['texts']['tokens_mean']} tokens/text on average. "
        + (f"Other processes used {min(others):.2f}-{max(others):.2f} cores during the phases "
           f"(load average {m['loadavg_1m_start']} at the start)"
           + (": the machine was shared, so the phases ran under different loads." if m.get("shared") else ".")
           if others else ""),
    ]
    return "\n".join(lines)

def _semi(part: str) -> str:
    return f"; {part}" if part else ""


def _gpu(machine: dict, cfg: dict) -> str:
    """Which GPU, and whether the text model ran on it (Triton's cuda variant) or beside it on the CPU."""
    variant = cfg.get("triton_variant", "cpu")
    if not machine.get("gpu"):
        return f"no GPU (Triton's {variant} variant on the CPU)"
    where = "on it" if variant != "cpu" else "on the CPU beside it"
    return f"GPU {machine['gpu']} (Triton's {variant} variant {where})"


def state_kb_per_post(p: dict) -> str:
    """Changelog kilobytes a post cost in a pass: each checkpoint writes every key it changed, whole, so the
    slower the posts come the fewer posts share a write."""
    if "state_written_bytes" not in p["workers"]:  # a report from before the counter
        return ""
    written = sum(p["workers"]["state_written_bytes"].values())
    return f"; {written / max(1, p['posts']) / 1000:.1f} KB of feature-table states written a post"


def broker_held(p: dict) -> str:
    """What the embedded broker held when a pass began and the cores it used meanwhile: its CPU grows with
    what it holds (it rewrites it all to one file while anything changes)."""
    held = p.get("broker_data_mb")
    if held is None:  # an external broker, records kept (--keep-records), or a report from before
        return ""
    cores = p["cpu"]["cpu_s"].get("broker", 0.0) / max(p["cpu"]["wall_s"], 1e-9)
    return f"; the broker held {held:.0f} MB at the start and used {cores:.2f} cores"


def _latency_parts(p: dict) -> str:
    """Where a latency pass's time went (from each post's scheduled send time): the decision published inside its
    transaction, then visible once the transaction committed (and the reader fetched it), and from the produce()
    call; Triton's requests and the checkpoints beside them."""
    w, wall = p["workers"], p["cpu"]["wall_s"]
    rate = f"{w['checkpoints'] / wall:.1f}/s" if wall else "?"
    tr = p.get("triton") or {}
    server = ""
    if tr.get("requests"):
        # the worker's request time = Triton's queue (behind the other batch in flight) + its compute + transport
        server = (f" (in Triton: {_f(1000 * tr['queue_s'] / tr['requests'])} ms queued, "
                  f"{_f(1000 * tr['model_compute_s'] / max(1, tr['executions']))} ms computing; model busy "
                  f"{_f(100 * (tr['model_busy_share'] or 0), 0)}% of the pass)")
    produced = ""
    if p.get("from_produce"):
        produced = f" ({from_produce(p)}, the producer up to {_f(p['producer_behind_max_s'], 3)} s behind its schedule)"
    return (f"at {_f(p['offered_posts_per_s'])} posts/s: published p50 / p99 {_f(p['published']['p50_ms'], 0)} / "
            f"{_f(p['published']['p99_ms'], 0)} ms, visible {_f(p['p50_ms'], 0)} / {_f(p['p99_ms'], 0)} ms{produced}; "
            f"Triton batches of {_f(w['avg_batch'])} posts, {_f(w['triton_request_mean_ms'])} ms a request{server}; "
            f"{w['checkpoints']} checkpoints ({rate}) of {_f(w['checkpoint_mean_ms'])} ms on average"
            + state_kb_per_post(p) + broker_held(p) + tail_episodes(p))


def tail_episodes(p: dict) -> str:
    """When the pass's slowest 1% were produced: one episode is a stall, many are the queue's bursts."""
    t = p.get("tail")
    if not t:  # a report from before the tail was recorded
        return ""
    return (f"; its slowest {t['slowest_posts']} posts were produced in {t['episodes']} episode(s) at "
            f"{', '.join(f'{s:g}' for s in t['produced_at_s'][:12])} s (the busiest second brought "
            f"{t['busiest_second_posts']} posts, the mean {_f(t['mean_posts_per_s'])})" + _waited(t))


def _waited(t: dict) -> str:
    if not t.get("slowest_waited"):
        return ""
    def ms(w):
        return " / ".join(_f(w[k], 0) for k in ("to_decided_ms", "to_published_ms", "to_visible_ms"))
    return (f"; waited (ms to the verdict / to publish / to be seen, medians): those {ms(t['slowest_waited'])}, "
            f"all {ms(t['all_waited'])}")


def profile_lines(profile: dict | None, top: int = 8) -> list[str]:
    """Where each worker's event loop went in the profiled saturation pass (py-spy; loadgen/bench/profiling.py)."""
    lines = []
    for name, p in (profile or {}).items():
        if "error" in p:
            lines.append(f"{name} event loop (py-spy): not profiled: {p['error']}")
            continue
        where = ", ".join(f"{func} {share:.0%}" for func, share in p["top"][:top])
        lines.append(f"{name} event loop (py-spy, profiled pass: slower): {p['main_thread_busy_samples']} busy samples "
                     f"of the main thread; its work went through {where}")
    return lines


def format_text(report: dict) -> str:
    sat = report["pipeline"]["saturation"]
    tr = sat["triton"]
    notes = [
        "",
        f"pipeline saturation: steady {_f(sat['posts_per_s_steady'])}/s, overall {_f(sat['posts_per_s_overall'])}/s "
        f"({sat['posts']} posts in {sat['time_to_last_decision_s']} s); items applied without a Kafka hop: "
        f"{sat['workers']['local_hops']}{state_kb_per_post(sat)}",
        "idle stack (nothing to process), cores: " + ", ".join(f"{k} {v}" for k, v in sat["idle_cores"].items()),
        f"Triton during saturation: model busy {_f(100 * (tr['model_busy_share'] or 0), 0)}% of the time, "
        f"server batch {tr['avg_server_batch']}, {_f(tr['model_compute_s'], 2)} s of model time for {tr['rows']} "
        "texts (the machine's speed in this run: compare two runs only where it agrees)",
        *(_latency_parts(report["pipeline"][name]) for name in ("low_rate", "latency")),
        *profile_lines(sat.get("profile")),
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
