"""How far a consumer group is behind on its input topics, counted in records a read_committed reader would
still get (the chaos run's drain check, the local stack's status line, the fuzzer's wait)."""

from __future__ import annotations

import time
import uuid

from modpipe.services.offsets import watermarks
from modpipe.settings import Settings


def end_offsets(settings: Settings, bootstrap: str, topics: list[str],
                isolation: str = "read_uncommitted") -> dict[tuple[str, int], int]:
    """The end offset of each partition of `topics` as a reader of that isolation level sees it: the high
    watermark (`read_uncommitted`), or the last stable offset (`read_committed`), which an open transaction
    holds back at its first record."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**settings.kafka_client_config(), "bootstrap.servers": bootstrap,
                         "isolation.level": isolation, "group.id": f"modpipe-ends-{uuid.uuid4().hex[:8]}"})
    try:
        return {(t, p): watermarks(consumer, TopicPartition(t, p), 10)[1]
                for t in topics for p in range(settings.partitions)}
    finally:
        consumer.close()


def uncommitted_input(settings: Settings, bootstrap: str, topics: list[str], group: str | None = None,
                      per_partition: dict | None = None, wait_s: float = 2.0) -> int:
    """Records in `topics` that the consumer group (default: the workers') has not committed yet: those a
    `read_committed` reader gets from the group's committed offset (the log start where none) to the end of
    each partition. Not the end offset minus the committed offset: a worker commits the offset after the
    last record it processed, and when a transaction wrote that record its commit marker follows it (the
    end offset is one past the marker), so that difference stays 1 for good on every partition of a topic
    written in transactions. A partition whose end the reader cannot reach within `wait_s` (an open
    transaction holds it) counts its end offset minus the committed offset: still in flight."""
    from confluent_kafka import Consumer, TopicPartition

    base = {**settings.kafka_client_config(), "bootstrap.servers": bootstrap, "enable.auto.commit": False}
    admin = Consumer({**base, "group.id": group or settings.app_id, "isolation.level": "read_uncommitted"})
    try:
        tps = [TopicPartition(t, p) for t in topics for p in range(settings.partitions)]
        start: dict[tuple[str, int], int] = {}
        ends: dict[tuple[str, int], int] = {}
        for tp in admin.committed(tps, timeout=10):
            low, high = watermarks(admin, TopicPartition(tp.topic, tp.partition), 10)
            at = tp.offset if tp.offset >= 0 else low
            if high > at:
                start[(tp.topic, tp.partition)], ends[(tp.topic, tp.partition)] = at, high
    finally:
        admin.close()
    if not ends:
        return 0
    counts = dict.fromkeys(ends, 0)
    reader = Consumer({**base, "group.id": f"modpipe-lag-{uuid.uuid4().hex[:8]}",
                       "isolation.level": "read_committed", "enable.partition.eof": False})
    try:
        reader.assign([TopicPartition(t, p, at) for (t, p), at in start.items()])
        left = dict(ends)
        deadline = time.monotonic() + wait_s
        while left and time.monotonic() < deadline:
            for msg in reader.consume(1000, 0.1):
                key = (msg.topic(), msg.partition())
                if not msg.error() and key in counts and msg.offset() < ends[key]:
                    counts[key] += 1
            for tp in reader.position([TopicPartition(t, p) for t, p in left]):
                if tp.offset >= left[(tp.topic, tp.partition)]:
                    del left[(tp.topic, tp.partition)]
        for key in left:  # not read to the end: an open transaction, or the broker is slow
            counts[key] = max(counts[key], ends[key] - start[key])
    finally:
        reader.close()
    if per_partition is not None:
        per_partition.update({f"{t}[{p}]": n for (t, p), n in counts.items() if n})
    return sum(counts.values())
