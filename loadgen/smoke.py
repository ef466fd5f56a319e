"""`modpipe smoke`: produce N held-out posts plus malformed records, wait for every verdict, report.

Uses running services when KAFKA_BOOTSTRAP_SERVERS is set (workers must be running there),
otherwise starts the embedded stack for the duration.
"""

from __future__ import annotations

import base64
import contextlib
import time
import uuid

import numpy as np
import orjson
from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition
from modpipe.loadgen.posts import labelled_posts, malformed_records
from modpipe.streams.moderation.topics import TopicNames

from modpipe import log, schema
from modpipe.output import progress_bar
from modpipe.services.fetching import PACED_CONSUMER_CONFIG
from modpipe.services.offsets import watermarks
from modpipe.settings import Settings
from modpipe.textmodel.artifacts import resolve_model

_log = log.get(__name__)


def end_consumer(settings: Settings, bootstrap: str, topics: list[str], paced: bool = False) -> Consumer:
    """A group-less consumer positioned at the current end of `topics`: it sees only this run's records.
    `paced`: for `fetching.paced_fetches` (its configuration adds end-of-partition events)."""
    conf = {**settings.kafka_consumer_config(), "bootstrap.servers": bootstrap,
            "group.id": f"modpipe-smoke-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
            **(PACED_CONSUMER_CONFIG if paced else {})}
    consumer = Consumer(conf)
    tps = []
    for topic in topics:
        for p in range(settings.partitions):
            _, high = watermarks(consumer, TopicPartition(topic, p), 10)
            tps.append(TopicPartition(topic, p, high if high >= 0 else OFFSET_END))
    consumer.assign(tps)
    return consumer


def run_smoke(settings: Settings, bootstrap: str, n_posts: int, timeout_s: float = 120.0,
              progress: bool = True, healthy=lambda: True) -> dict:
    """`healthy()` is polled while waiting: when it turns False (a worker died), stop waiting."""
    names = TopicNames.from_settings(settings)
    texts = resolve_model(settings).heldout()
    run_id = f"smoke-{uuid.uuid4().hex[:8]}"
    consumer = end_consumer(settings, bootstrap, [names.decisions, names.dead_letters])
    producer = Producer({**settings.kafka_client_config(), "bootstrap.servers": bootstrap, "linger.ms": 5,
                         "enable.idempotence": True})
    sent_at: dict[str, float] = {}
    labels: dict[str, str] = {}
    for post, label in labelled_posts(texts, n_posts, run_id):
        sent_at[post["post_id"]] = time.time()
        labels[post["post_id"]] = label
        producer.produce(names.posts, key=post["user_id"].encode(), value=schema.dumps(post))
        producer.poll(0)
    malformed = malformed_records(run_id)
    for _, raw in malformed:
        producer.produce(names.posts, key=run_id.encode(), value=raw)
    if producer.flush(30) != 0:
        raise RuntimeError("could not deliver every smoke record to the broker")

    decisions: dict[str, list[dict]] = {}
    latencies_ms: list[float] = []
    dlq_reasons: list[str] = []
    deadline = time.monotonic() + timeout_s
    bar = progress_bar(total=n_posts + len(malformed), desc="verdicts", unit="msg", enabled=progress)
    try:
        while time.monotonic() < deadline and (len(decisions) < n_posts or len(dlq_reasons) < len(malformed)):
            msg = consumer.poll(0.2)
            if msg is None and not healthy():
                _log.error("a worker died; stopping the smoke check early")
                break
            if msg is None or msg.error():
                continue
            if msg.topic() == names.decisions:
                d = schema.decode_decision(msg.value())
                if d["post_id"] in sent_at:
                    if d["post_id"] not in decisions:
                        latencies_ms.append((time.time() - sent_at[d["post_id"]]) * 1000)
                        bar.update(1)
                    decisions.setdefault(d["post_id"], []).append(d)
            else:


                record = orjson.loads(msg.value())
                if run_id.encode() in base64.b64decode(record["raw"]):
                    dlq_reasons.append(record["reason"])
                    bar.update(1)
    finally:
        bar.close()
        consumer.close()

    correct = sum((ds[0]["spam_probability"] >= settings.review_threshold) == (labels[pid] == "spam")
                  for pid, ds in decisions.items())
    expected_reasons = sorted(r for r, _ in malformed)
    return {
        "run_id": run_id,
        "sent": n_posts,
        "decided": len(decisions),
        "dlq": len(dlq_reasons),
        "dlq_expected": len(malformed),
        "dlq_reasons_match": sorted(dlq_reasons) == expected_reasons,
        "lost": n_posts - len(decisions) + max(0, len(malformed) - len(dlq_reasons)),
        "duplicates": sum(len(ds) - 1 for ds in decisions.values()),
        "p50_ms": round(float(np.percentile(latencies_ms, 50)), 1) if latencies_ms else None,
        "p99_ms": round(float(np.percentile(latencies_ms, 99)), 1) if latencies_ms else None,
        "accuracy": round(correct / len(decisions), 4) if decisions else None,
        "verdicts": {v: sum(ds[0]["verdict"] == v for ds in decisions.values()) for v in schema.VERDICTS},
    }


def smoke(settings: Settings, n_posts: int, workers: int = 1, timeout_s: float = 180.0,
          progress: bool = True) -> dict:
    if settings.bootstrap_servers:
        return run_smoke(settings, settings.bootstrap_servers, n_posts, timeout_s, progress)
    from modpipe.streams.local.stack import LocalStack

    with contextlib.ExitStack() as stack:
        local = stack.enter_context(LocalStack(settings, workers=workers))
        return run_smoke(settings, local.bootstrap, n_posts, timeout_s, progress,
                         healthy=lambda: all(w.process.alive() for w in local.workers))
