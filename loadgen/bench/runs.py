"""One end-to-end benchmark run: the same texts through the pipeline, the seed and the ceiling on an
isolated local stack, and the report with ratios, targets and how busy the machine was."""

from __future__ import annotations

import dataclasses
import shutil
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from modpipe.loadgen.bench.ceilings import (
    DEFAULT_CEILING_BATCHES,
    UNTRIMMED_PROBE,
    ceiling_pass,
    ort_options,
    ort_session,
    seed_pass,
    untrimmed_probe,
)
from modpipe.loadgen.bench.metering import CpuMeter, loadavg_1m, machine_info, triton_server_info
from modpipe.loadgen.bench.pipeline import BenchError, DecisionLog, pipeline_passes
from modpipe.loadgen.bench.report import capacity, ratio, targets
from modpipe.simulation.simulator import Event, Simulation

from modpipe import log
from modpipe.settings import Settings
from modpipe.textmodel.artifacts import ModelBuild, resolve_model
from modpipe.textmodel.tokenize import BatchTokenizer

_log = log.get(__name__)

DEFAULT_POSTS = 400
DEFAULT_LOAD = 0.5
DEFAULT_LOW_RATE = 5.0
DEFAULT_LOW_POSTS = 150
SHARED_CORES = 0.25  # other processes using more than this many cores in a phase: the machine was shared


def bench_posts(texts: list[dict], n: int, run_id: str, scenario: str = "mixed", seed: int = 0) -> list[Event]:
    """The first `n` posts (no side events) of a seeded simulation. The same (texts, n, scenario, seed)
    give the same texts, users and links whatever `run_id` is; the ids differ."""
    sim = Simulation(texts, scenario, seed, start_ms=int(time.time() * 1000), run_id=run_id)
    # one post per arrival; the side events the posts cause (reports, shares, ...) are left out
    posts = [ev for ev in sim.events(k / 50.0 for k in range(n)) if ev.kind == "post"]
    assert len(posts) == n
    return posts

def isolated_settings(settings: Settings, build: ModelBuild, name: str, state_root: Path) -> Settings:
    """Own topics (prefix `<name>.`), group, state dir and ports: a run never meets `modpipe up` or another run."""
    from modpipe.services.process import free_port

    changes: dict = {"state_dir": state_root, "model_dir": str(build.path),
                     "topic_prefix": f"{settings.topic_prefix}{name}.", "app_id": f"{settings.app_id}-{name}",
                     "metrics_port": free_port(), "text_model": "on"}
    if not settings.bootstrap_servers:
        changes["broker_port"] = free_port()
    if not settings.triton_url:
        changes.update(triton_http_port=free_port(), triton_grpc_port=free_port(), triton_metrics_port=free_port())
    return dataclasses.replace(settings, **changes)

def run(settings: Settings, n_posts: int = DEFAULT_POSTS, workers: int | None = None, *, load: float = DEFAULT_LOAD,
        load_rate: float | None = None, low_rate: float = DEFAULT_LOW_RATE, low_posts: int = DEFAULT_LOW_POSTS,
        arrivals: str = "poisson", scenario: str = "mixed", seed: int = 0,
        ceiling_batch_sizes: Sequence[int] = DEFAULT_CEILING_BATCHES, warmup_posts: int = 20,
        timeout_s: float = 300.0, progress: bool = True, keep_state: bool = False, idle_s: float = 3.0,
        untrimmed_texts: int = UNTRIMMED_PROBE, baseline_posts: int | None = None,
        profile_dir: Path | None = None, keep_records: bool = False) -> dict:
    """Run the three paths and return the report (see the module docstring). `baseline_posts`: the seed and
    the ceilings run on the first N of the pipeline's posts (per-text rates; on a GPU host the CPU ceiling of
    a long saturation pass would take longer than the pipeline). `profile_dir`: py-spy on every worker during
    the first saturation pass (loadgen/bench/profiling.py), raw stacks kept there."""
    from modpipe.streams.local.stack import LocalStack

    from modpipe.output import progress_bar

    if n_posts < 10:
        raise ValueError("--posts must be at least 10")
    if not 0 < load <= 1:
        raise ValueError("--load must be in (0, 1]")
    if load_rate is not None and not load_rate > 0:
        raise ValueError("--load-rate must be a positive number of posts/s")
    baseline_posts = min(baseline_posts or n_posts, n_posts)
    if baseline_posts < 10:
        raise ValueError("--baseline-posts must be at least 10")
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
    base_texts, base_lengths = post_texts[:baseline_posts], lengths[:baseline_posts]

    state_root = settings.state_dir / "bench" / f"e2e-{tag}"
    settings = isolated_settings(settings, build, f"bench{tag}", state_root)
    info = machine_info()
    options = ort_options()
    report: dict = {
        "config": {"posts": n_posts, "workers": workers, "scenario": scenario, "seed": seed, "load": load,
                   "load_rate": load_rate, "keep_records": keep_records,
                   "low_rate": low_rate, "low_posts": low_posts, "local_hops": settings.local_hops,
                   "arrivals": arrivals, "warmup_posts": warmup_posts, "max_batch": settings.max_batch,
                   "max_wait_ms": settings.max_wait_ms, "max_inflight": settings.max_inflight,
                   "partitions": settings.partitions, "commit_interval_ms": settings.commit_interval_ms,
                   "ceiling_batch_sizes": list(ceiling_batch_sizes), "triton_variant": settings.triton_variant,
                   "baseline_posts": baseline_posts, "profile_dir": str(profile_dir) if profile_dir else None},
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
                    progress=progress, idle_s=idle_s, load_rate=load_rate, profile_dir=profile_dir,
                    keep_records=keep_records)
            finally:
                decisions.close()
            for w in stack.workers:  # the seed gets the machine to itself (with its Triton)
                w.stop()
            _log.info("bench: seed")
            groups = {"triton": stack.triton.pid} if stack.triton is not None else {}
            cpu = CpuMeter(groups)
            with progress_bar(total=baseline_posts, desc="seed (batch 1, width 128)", unit="post", enabled=progress) as bar:
                report["seed"] = seed_pass(stack.triton_url, settings.triton_model, tok, base_texts, bar.update)
            report["seed"]["cpu"] = cpu.stop()
        _log.info("bench: ceiling")
        session = ort_session(build.onnx, options)
        cpu = CpuMeter()
        with progress_bar(total=baseline_posts * len(ceiling_batch_sizes), desc="ceiling (in-process ORT)", unit="post",
                          enabled=progress) as bar:
            report["ceiling"] = ceiling_pass(session, tok, base_texts, ceiling_batch_sizes, bar.update)
        report["ceiling"]["cpu"] = cpu.stop()
        report["ceiling"]["threads"] = int(options["intra_op_threads"])
        # A stricter bound than the ceiling: an offline job may sort every text by length first,
        # so that no batch pays for padding. Reported beside it; the target stays on the ceiling.
        by_length = [base_texts[i] for i in np.argsort(base_lengths, kind="stable")]
        with progress_bar(total=baseline_posts * len(ceiling_batch_sizes), desc="ceiling, texts sorted by length", unit="post",
                          enabled=progress) as bar:
            report["ceiling_sorted"] = ceiling_pass(session, tok, by_length, ceiling_batch_sizes, bar.update)
        report["seed"]["untrimmed_compute"] = untrimmed_probe(session, tok, base_texts[:untrimmed_texts])
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
                "load_p99_ms": p["latency"]["p99_ms"], "load_share": p["latency"]["load"]}
    report["targets"] = targets(measured)
    report["all_targets_met"] = all(t["met"] for t in report["targets"].values())
    report["capacity"] = capacity(per_post.get("workers"), cpu_ms_per_post=per_post)
    phases = {"pipeline_saturation": p["saturation"]["cpu"], "pipeline_low_rate": p["low_rate"]["cpu"],
              "pipeline_latency": p["latency"]["cpu"], "pipeline_text_cache": p["saturation_text_cache"]["cpu"],
              "seed": report["seed"]["cpu"], "ceiling": report["ceiling"]["cpu"]}
    others = {k: v.get("other_cores") for k, v in phases.items()}
    report["machine"]["other_cores_by_phase"] = others
    # another user of the machine took a noticeable share in some phase: the ratios compare unequal conditions
    report["machine"]["shared"] = any(v is not None and v > SHARED_CORES for v in others.values())
    report["machine"]["loadavg_1m_end"] = loadavg_1m()
    return report
