"""The load generator's producer is ready before its traffic's clock starts, on the real broker.

librdkafka's idempotent producer gets its producer id right after it connects, but a record produced before
that waits for the next tick of its idempotence timer: the first record took 500-1,000 ms on the embedded
broker, and `modpipe loadgen` measures latency from the produce() call, so its first second looked slow
(p99 ~1.1 s at 5 posts/s). `make_producer(..., ready_timeout_s=...)` waits for the producer id first."""

from __future__ import annotations

import statistics
import time
import uuid

import pytest
from modpipe.loadgen.traffic import make_producer

from modpipe.settings import Settings
from tests.fixtures.kafka import create_topics

pytestmark = pytest.mark.integration


def first_delivery_s(bootstrap: str, topic: str, **kwargs) -> float:
    producer = make_producer(Settings.from_env({}), bootstrap, **kwargs)
    delivered: list[float] = []
    started = time.perf_counter()
    producer.produce(topic, b"first", key=b"k", on_delivery=lambda err, msg: delivered.append(time.perf_counter()))
    assert producer.flush(10) == 0 and delivered
    return delivered[0] - started


def test_a_ready_producer_delivers_its_first_record_at_once(bootstrap):
    topic = f"producer-ready-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic])
    ready = [first_delivery_s(bootstrap, topic, ready_timeout_s=10) for _ in range(3)]
    assert statistics.median(ready) < 0.3, f"first record delivered after {[round(s, 3) for s in ready]} s"
