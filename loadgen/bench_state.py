"""`modpipe bench state`: what table state costs one worker when every post brings keys it has not seen (N
distinct users, links and IP addresses, so every table grows by N keys; the domain table by N / 100), with
the tables in RocksDB (MODPIPE_STATE_BACKEND=rocksdb) and in memory, one after the other in the same run on
the same broker, text model off. Each pass reports the worker's resident memory (peak and at the end), the
stores' size on disk, bytes per key per table, the feature path's posts/s, and the restore after a SIGKILL of
the worker: the seconds the restore took, the changelog records it read, and the seconds from the kill until
the worker was ready again; with RocksDB, again after a SIGKILL that also lost the stores (a new pod on an
empty disk: the whole changelog read). The worker's caches and buffers are sized by MODPIPE_WORKER_MEMORY_MB (a worker
meant for a pod of 1 GiB: MODPIPE_WORKER_MEMORY_MB=1024)."""

from __future__ import annotations

import dataclasses
import ipaddress
import random
import shutil
import time
import uuid
from pathlib import Path

import orjson
from confluent_kafka import Producer
from modpipe.loadgen.posts import make_post
from modpipe.loadgen.smoke import end_consumer
from modpipe.streams.local.stack import LocalStack
from modpipe.streams.moderation.app import tables_dir
from modpipe.streams.moderation.topics import ensure_topics
from modpipe.streams.state.rocksdb import disk_bytes

from modpipe import log, schema
from modpipe.output import progress_bar
from modpipe.services.broker import scratch_endpoint
from modpipe.settings import Settings

BACKENDS = ("rocksdb", "memory")
TARGETS = {"rss_mib": 1024, "restore_s": 30.0, "posts_per_s_ratio": 0.8}
MIB = 1024 * 1024
IDLE_S = 12.0


def distinct_posts(n: int, run: str, seed: int = 3):
    """N posts, each with a user, a link and an IP address no other post has (the domain: one of N / 100);
    made as they are sent (a million posts held at once would take the bench ~3 GB)."""
    rng = random.Random(seed)
    for i in range(n):
        post = make_post(rng, f"{run}-p{i}", "see the offer", user_id=f"{run}-u{i}")
        post["url"] = f"https://www.d{i % max(1, n // 100)}-{run}.com/item/{i}"
        post["ip"] = str(ipaddress.IPv4Address(0x0B000000 + i))  # 11.0.0.0/8: public, one per post
        post.pop("url_reputation", None)
        yield post


def rss_bytes(pid: int) -> tuple[int, int]:
    """(resident now, resident peak) of a process, from /proc."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields.get("VmRSS", 0), fields.get("VmHWM", 0)


def _produce(bootstrap: str, topic: str, posts) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "partitioner": "murmur2_random",
                         "logger": log.kafka_client_logger()})
    for post in posts:
        while True:
            try:
                producer.produce(topic, key=post["user_id"].encode(), value=schema.dumps(post))
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    producer.flush(120)


def _sum(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


def _keys(metrics: dict[str, float]) -> dict[str, int]:
    """Keys the worker holds per table."""
    return {t: int(_sum(metrics, f"modpipe_table_keys{{table={t}}}")) for t in ("user", "url", "domain", "ip", "post")}


def one_pass(settings: Settings, backend: str, n: int, progress: bool, timeout_s: float) -> dict:
    tag = uuid.uuid4().hex[:6]
    settings = dataclasses.replace(settings, state_backend=backend, topic_prefix=f"{settings.topic_prefix}{backend}{tag}.",
                                   app_id=f"{settings.app_id}-{backend}{tag}")
    run = f"{backend}{tag}"
    bootstrap = settings.bootstrap_servers
    ensure_topics(settings, bootstrap)
    with LocalStack(settings, workers=1, extra_env={"MODPIPE_STATE_BACKEND": backend}) as stack:
        worker = stack.workers[0]
        consumer = end_consumer(settings, bootstrap, [stack.topics.decisions])
        rss_start = rss_bytes(worker.process.pid)[0]
        rss_peak = rss_start
        wanted = {f"{run}-p{i}" for i in range(n)}
        started = time.time()
        _produce(bootstrap, stack.topics.posts, distinct_posts(n, run))
        decided: dict[str, float] = {}
        timeline: list[tuple[int, float]] = []
        sampled_at = 0.0
        with progress_bar(total=n, desc=f"decisions ({backend})", enabled=progress) as bar:
            while len(decided) < len(wanted) and time.time() - started < timeout_s:
                if not worker.process.alive():
                    raise RuntimeError(f"the worker died; see {worker.process.log_path}")
                if time.time() - sampled_at > 0.5:
                    sampled_at = time.time()
                    rss_now = rss_bytes(worker.process.pid)[0]
                    rss_peak = max(rss_peak, rss_now)
                    if len(decided) >= len(timeline) * n / 10:  # resident memory as the keys grow
                        timeline.append((len(decided), round(rss_now / MIB, 1)))
                for msg in consumer.consume(2000, 0.2):
                    if msg.error():
                        continue
                    pid = orjson.loads(msg.value())["post_id"]
                    if pid in wanted and pid not in decided:
                        decided[pid] = msg.timestamp()[1] / 1000.0
                        bar.update(1)
        consumer.close()
        if len(decided) != len(wanted):
            raise RuntimeError(f"{len(wanted) - len(decided)} of {n} posts got no decision in {timeout_s:.0f} s")
        from modpipe.loadgen.bench.pipeline import saturation_rates

        rates = saturation_rates(started, list(decided.values()))
        # idle: every decision's feedback applied to the tables too (it reaches them through the stage topics
        # after the decision is out), the last checkpoint's stores written, and the worker's malloc_trim (every
        # 5 s) has handed the heap's free pages back: what the worker holds, not what the burst took
        deadline = time.time() + timeout_s
        while (stack.group_lag() or 0) > 0 and time.time() < deadline:
            time.sleep(1.0)
        time.sleep(IDLE_S)
        rss_end, rss_hwm = rss_bytes(worker.process.pid)
        metrics = stack.scrape()
        keys = _keys(metrics)
        encoded = {t: int(_sum(metrics, f"modpipe_table_bytes{{table={t}}}")) for t in keys}
        root = tables_dir(settings, worker.name)
        disk = {t: disk_bytes(root / t) for t in keys} if backend == "rocksdb" else {}

        # a crash: SIGKILL, then a restart under the same name (its stores are where it left them)
        killed = time.monotonic()
        worker.process.kill()
        stack.start_worker(0)
        stack.wait_workers_ready(timeout=max(120.0, timeout_s))
        ready_s = time.monotonic() - killed
        after = stack.scrape()
        from_empty = None
        if backend == "rocksdb":  # a new pod on an empty disk: every store restored from its whole changelog
            worker = stack.workers[0]
            killed = time.monotonic()
            worker.process.kill()
            shutil.rmtree(root, ignore_errors=True)
            stack.start_worker(0)
            stack.wait_workers_ready(timeout=max(120.0, timeout_s))
            empty = stack.scrape()
            from_empty = {"keys": _keys(empty), "seconds": round(_sum(empty, "modpipe_table_restore_seconds"), 2),
                          "changelog_records_read": int(_sum(empty, "modpipe_table_restored_records_total")),
                          "kill_to_ready_s": round(time.monotonic() - killed, 1),
                          "rss_mib": round(rss_bytes(stack.workers[0].process.pid)[0] / MIB, 1)}
    total_keys = sum(keys.values())
    return {
        "backend": backend, "posts": n,
        "posts_per_s": rates["steady"] or rates["overall"], "posts_per_s_overall": rates["overall"],
        # peak: every post was produced at once, so the worker held its bounded buffers full throughout;
        # idle: after the run, once the heap's free pages went back
        "rss_mib": {"start": round(rss_start / MIB, 1), "peak": round(max(rss_peak, rss_hwm) / MIB, 1),
                    "idle": round(rss_end / MIB, 1)},
        "keys": keys,
        "encoded_bytes_per_key": {t: round(encoded[t] / keys[t]) if keys[t] else None for t in keys},
        "disk_bytes": sum(disk.values()) if disk else None,
        "disk_bytes_per_key": {t: round(disk[t] / keys[t]) if keys[t] else None for t in disk} if disk else None,
        "rss_bytes_per_key": round((rss_end - rss_start) / total_keys) if total_keys else None,
        "rss_mib_by_posts": timeline,
        # what the worker's byte-bounded caches and buffers held at the end (modpipe/memory.py)
        "cache_mib": round(_sum(metrics, "modpipe_cache_bytes") / MIB, 1),
        "restore": {"keys": _keys(after), "seconds": round(_sum(after, "modpipe_table_restore_seconds"), 2),
                    "changelog_records_read": int(_sum(after, "modpipe_table_restored_records_total")),
                    "kill_to_ready_s": round(ready_s, 1)},
        "restore_from_empty_disk": from_empty,
    }


def run(settings: Settings, n: int, backends=BACKENDS, progress: bool = True, timeout_s: float = 7200.0) -> dict:
    with scratch_endpoint(dataclasses.replace(settings, text_model="off"), "bstate") as (settings, own_broker):
        passes = {b: one_pass(settings, b, n, progress, timeout_s) for b in backends}
    report = {"broker": settings.broker if own_broker else "external", "posts": n,
              "worker_memory_mb": settings.worker_memory_mb, "passes": passes}
    rocks = passes.get("rocksdb")
    if rocks:
        keys = sum(rocks["keys"].values())
        report["capacity"] = {
            "keys_per_gib_ram": round(keys / max(rocks["rss_mib"]["idle"] / 1024, 1e-9)),
            "keys_per_gib_disk": round(keys / (rocks["disk_bytes"] / 1024**3)) if rocks["disk_bytes"] else None,
            "restore_s_per_million_keys": round(rocks["restore"]["seconds"] / keys * 1e6, 2) if keys else None,
        }
        empty = rocks.get("restore_from_empty_disk")
        if empty and keys:
            report["capacity"]["restore_from_empty_disk_s_per_million_keys"] = round(empty["seconds"] / keys * 1e6, 2)
        targets = {"rss_mib": {"target": f"<= {TARGETS['rss_mib']} (peak)", "value": rocks["rss_mib"]["peak"],
                               "met": rocks["rss_mib"]["peak"] <= TARGETS["rss_mib"]},
                   "restore_s": {"target": f"<= {TARGETS['restore_s']}", "value": rocks["restore"]["kill_to_ready_s"],
                                 "met": rocks["restore"]["kill_to_ready_s"] <= TARGETS["restore_s"]}}
        if "memory" in passes:
            ratio = round(rocks["posts_per_s"] / passes["memory"]["posts_per_s"], 3)
            targets["posts_per_s_over_memory"] = {"target": f">= {TARGETS['posts_per_s_ratio']}", "value": ratio,
                                                  "met": ratio >= TARGETS["posts_per_s_ratio"]}
        report["targets"] = targets
    return report
