"""Reading a topic back to its end: every record now in it, once, then stop (chaos reports, label joins)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

from modpipe.services.offsets import watermarks
from modpipe.settings import Settings


def read_to_end(settings: Settings, bootstrap: str, topics: list[str], timeout_s: float = 120.0,
                isolation: str = "read_committed") -> Iterator:
    """Every record now in `topics` that a reader with `isolation` is given, from the log start to the end
    offsets read at the start (for `read_committed` the last stable offset: an open transaction's records
    are left out)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**settings.kafka_consumer_config(), "isolation.level": isolation, "bootstrap.servers": bootstrap,
                         "group.id": f"modpipe-readback-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "enable.partition.eof": False,
                         "fetch.max.bytes": 50_000_000,
                         "max.partition.fetch.bytes": 10_000_000})
    try:
        remaining: dict[tuple[str, int], int] = {}
        tps = []
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=30).topics.get(topic)
            if meta is None or meta.error is not None:
                continue
            for p in meta.partitions:
                low, high = watermarks(consumer, TopicPartition(topic, p), 30)
                if high > low:
                    remaining[(topic, p)] = high
                    tps.append(TopicPartition(topic, p, low))
        consumer.assign(tps)
        deadline = time.monotonic() + timeout_s
        while remaining:
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {len(remaining)} partitions to their end: {sorted(remaining)[:5]}")
            for msg in consumer.consume(1000, 0.5):
                if msg.error():
                    continue
                end = remaining.get((msg.topic(), msg.partition()))
                if end is not None and msg.offset() < end:
                    yield msg
            # by position, not by the last record's offset: in a topic written in transactions the last
            # offset is a commit marker, which is never delivered
            for tp in consumer.position([TopicPartition(t, p) for t, p in remaining]):
                if tp.offset >= remaining[(tp.topic, tp.partition)]:
                    del remaining[(tp.topic, tp.partition)]
    finally:
        consumer.close()
