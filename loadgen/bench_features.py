"""`modpipe bench features`: posts/s through ingest + feature stages + decisions with the text model off,
beside a plain consume-and-produce loop on the same broker in the same run. The ratio is the cost of
our stages (validation, five keyed tables, decision assembly and publishing) over moving bytes through
Kafka. The feature path runs twice, on the same traffic with fresh ids: with local hops (the default: a stage
partition this worker owns is applied without a Kafka hop) and with every hop through its stage topic.
Each reports decisions/s over the steady part and the CPU per post of the workers and the broker."""

from __future__ import annotations

import dataclasses
import random
import time
import uuid
from pathlib import Path

import orjson
from confluent_kafka import Consumer, Producer
from modpipe.loadgen.posts import make_post
from modpipe.loadgen.smoke import end_consumer
from modpipe.streams.local.stack import LocalStack
from modpipe.streams.moderation.topics import ensure_topics

from modpipe import log, schema
from modpipe.output import progress_bar
from modpipe.services.broker import broker_pid, scratch_endpoint
from modpipe.settings import Settings

TEXTS = ["see you at lunch", "FREE entry! win cash now, text WIN to 80086", "meeting moved to 3pm",
         "check out my blog https://blog.example.org/post"]


def _posts(n: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [make_post(rng, f"bench-{uuid.uuid4().hex[:6]}-{i}", rng.choice(TEXTS), user_id=f"u{rng.randrange(500)}")
            for i in range(n)]


def _produce(bootstrap: str, topic: str, posts: list[dict]) -> None:
    # keyed by user_id with Kafka's default (Java) partitioner, as a platform's producer would
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "partitioner": "murmur2_random",
                         "logger": log.kafka_client_logger()})
    for post in posts:
        producer.produce(topic, key=post["user_id"].encode(), value=schema.dumps(post))
        producer.poll(0)
    producer.flush(60)


def plain_loop(settings: Settings, bootstrap: str, posts: list[dict]) -> float:
    """posts/s of consume -> decode -> produce, one confluent consumer and producer, no state."""
    src, dst = settings.topic("bench.plain.in"), settings.topic("bench.plain.out")
    _produce(bootstrap, src, posts)
    consumer = Consumer({**settings.kafka_consumer_config(), "bootstrap.servers": bootstrap,
                         "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": True})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "logger": log.kafka_client_logger()})
    consumer.subscribe([src])
    done, started = 0, None
    while done < len(posts):
        for msg in consumer.consume(500, 1.0):
            if msg.error():
                continue
            started = started or time.perf_counter()
            post = schema.decode_post(msg.value())
            producer.produce(dst, key=post["post_id"].encode(), value=msg.value())
            done += 1
        producer.poll(0)
    producer.flush(60)
    elapsed = time.perf_counter() - started
    consumer.close()
    return len(posts) / elapsed


def pipeline(settings: Settings, bootstrap: str, posts: list[dict], workers: int, progress: bool,
             broker_pid: int | None, local_hops: str, profile_dir: Path | None = None) -> dict:
    """The feature path at saturation, text model off: decisions/s over the steady part, CPU per post (until the
    workers have no input left: the verdicts' way back to the tables included).
    `profile_dir`: py-spy on each worker through the pass (it slows the pass it samples)."""
    from modpipe.loadgen.bench.metering import CpuMeter
    from modpipe.loadgen.bench.pipeline import per_table, saturation_rates, state_written_bytes
    from modpipe.loadgen.bench.profiling import WorkerProfiler

    settings = dataclasses.replace(settings, local_hops=local_hops,
                                   topic_prefix=f"{settings.topic_prefix}{local_hops}.",
                                   app_id=f"{settings.app_id}-{local_hops}")
    ensure_topics(settings, bootstrap)
    with LocalStack(settings, workers=workers) as stack:
        consumer = end_consumer(settings, bootstrap, [stack.topics.decisions])
        groups = {w.name: w.process.pid for w in stack.workers}
        if broker_pid:
            groups["broker"] = broker_pid
        wanted = {p["post_id"] for p in posts}
        metrics0 = stack.scrape()
        cpu = CpuMeter(groups)
        profiler = WorkerProfiler({w.name: w.process.pid for w in stack.workers}, profile_dir).start() \
            if profile_dir else None
        started = time.time()
        _produce(bootstrap, stack.topics.posts, posts)
        decided: dict[str, float] = {}
        with progress_bar(total=len(posts), desc=f"decisions (local hops {local_hops})", enabled=progress) as bar:
            while len(decided) < len(wanted) and time.time() - started < 600:
                if not all(w.process.alive() for w in stack.workers):
                    raise RuntimeError(f"a worker died; see {stack.workers[0].process.log_path.parent}")
                for msg in consumer.consume(1000, 0.2):
                    if msg.error():
                        continue
                    pid = orjson.loads(msg.value())["post_id"]
                    if pid in wanted and pid not in decided:
                        decided[pid] = msg.timestamp()[1] / 1000.0  # set by the worker when it published
                        bar.update(1)
        # CPU until the workers are done with these posts, not at their last decision: their verdicts may still
        # be on the way back to the tables through the stage topics (work the posts caused)
        last_decision = time.time()
        while (stack.group_lag() or 0) > 0 and time.time() - last_decision < 60:
            time.sleep(0.1)
        drain_s = time.time() - last_decision
        used = cpu.stop()
        profiles = profiler.stop() if profiler else None
        metrics1 = stack.scrape()
        written = state_written_bytes(metrics0, metrics1)
        writes = per_table(metrics0, metrics1, "modpipe_state_writes_total")
        checkpoints = metrics1.get("modpipe_checkpoint_duration_seconds_count", 0) - metrics0.get(
            "modpipe_checkpoint_duration_seconds_count", 0)
        consumer.close()
    if len(decided) != len(wanted):
        raise RuntimeError(f"{len(wanted) - len(decided)} posts got no decision")
    rates = saturation_rates(started, list(decided.values()))
    worker_s = sum(v for k, v in used["cpu_s"].items() if k.startswith("worker-"))
    return {"posts_per_s": rates["steady"] or rates["overall"], "posts_per_s_overall": rates["overall"],
            "worker_cpu_ms_per_post": round(1000 * worker_s / len(posts), 3),
            "broker_cpu_ms_per_post": round(1000 * used["cpu_s"].get("broker", 0.0) / len(posts), 3)
            if broker_pid else None,
            # every post produced at once: a checkpoint holds many posts of a key, so this is the least a
            # post costs the changelogs; paced posts share fewer writes (`modpipe bench` says how many)
            "state_bytes_per_post": {t: round(b / len(posts)) for t, b in written.items()},
            "state_writes_per_post": {t: round(n / len(posts), 3) for t, n in writes.items()},
            "checkpoints": int(checkpoints),
            "drain_after_last_decision_s": round(drain_s, 2),
            "other_cores": used.get("other_cores"),
            **({"profiles": profiles} if profiles is not None else {})}


def run(settings: Settings, n_posts: int = 3000, workers: int = 1, progress: bool = True,
        profile_dir: Path | None = None) -> dict:
    """`profile_dir`: py-spy on the workers of the local-hops pass (loadgen/bench/profiling.py)."""
    with scratch_endpoint(dataclasses.replace(settings, text_model="off"), "bench") as (settings, own_broker):
        bootstrap = settings.bootstrap_servers
        ensure_topics(settings, bootstrap)
        posts = _posts(n_posts)
        plain = plain_loop(settings, bootstrap, posts)
        own_pid = broker_pid(own_broker)
        paths = {mode: pipeline(settings, bootstrap, _posts(n_posts), workers, progress, own_pid, mode,
                                profile_dir if mode == "on" else None) for mode in ("on", "off")}
    ours = paths["on"]
    report = {"broker": settings.broker if own_broker else "external", "posts": n_posts, "workers": workers,
              "plain_loop_posts_per_s": round(plain, 1),
              "feature_path_posts_per_s": round(ours["posts_per_s"], 1),
              "ratio_feature_path_over_plain": round(ours["posts_per_s"] / plain, 4),
              "worker_cpu_ms_per_post": ours["worker_cpu_ms_per_post"],
              "broker_cpu_ms_per_post": ours["broker_cpu_ms_per_post"],
              "every_hop_through_kafka": {**paths["off"], "ratio_over_plain": round(paths["off"]["posts_per_s"] / plain, 4)},
              "local_hops": paths["on"]}
    from modpipe.loadgen.bench.report import capacity

    # the feature path alone (text model off): what a worker core and a broker core carry, and the workers a
    # machine of MACHINE_CORES cores would run for it (Triton's share comes from `modpipe bench`)
    report["capacity"] = capacity(ours["worker_cpu_ms_per_post"], cpu_ms_per_post={
        "workers": ours["worker_cpu_ms_per_post"], "broker": ours["broker_cpu_ms_per_post"]})
    per_worker = report["feature_path_posts_per_s"] / workers
    report["targets"] = {
        "posts_per_s_per_worker": {"target": ">= 1000", "value": round(per_worker, 1), "met": per_worker >= 1000},
        "ratio_over_plain": {"target": ">= 0.08", "value": report["ratio_feature_path_over_plain"],
                             "met": report["ratio_feature_path_over_plain"] >= 0.08},
        "worker_cpu_ms_per_post": {"target": "<= 1.0", "value": ours["worker_cpu_ms_per_post"],
                                   "met": ours["worker_cpu_ms_per_post"] <= 1.0},
        "broker_cpu_ms_per_post": {"target": "<= 1.5", "value": ours["broker_cpu_ms_per_post"],
                                   "met": ours["broker_cpu_ms_per_post"] is not None
                                   and ours["broker_cpu_ms_per_post"] <= 1.5},
    }
    return report
