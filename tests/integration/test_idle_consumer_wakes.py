"""An idle group consumer picks up new records at once, on the real broker.

The worker's consumer pauses its partitions after each empty fetch (the embedded broker answers an empty fetch
at once; modpipe/services/fetching.py). librdkafka notices a resume only when its broker thread wakes up, up to a
second later; a consumer that pauses again after 10 ms could miss that moment for seconds, and records produced
to a worker that had been idle waited 1.4-4.4 s (always a whole second and 0.44 s). `resume_now` wakes the
thread with a request; this test fails when the first record of a burst to an idle consumer takes a second or
more (after the fix it took 8-40 ms)."""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid

import pytest
from confluent_kafka import Producer
from modpipe.streams.kafka.consumer import ASSIGNMENT_GRACE_S, GroupConsumer

from tests.fixtures.kafka import create_topics

pytestmark = pytest.mark.integration

TOPICS, PARTITIONS = 4, 4
IDLE_S = ASSIGNMENT_GRACE_S + 2.0  # past the grace period, so the empty-fetch pauses are under way


async def first_record_after_idle(bootstrap: str, topics: list[str]) -> float:
    """Seconds from producing a burst into an idle consumer's partitions to the first record handed over."""
    got: list[float] = []
    assigned = asyncio.Event()

    async def on_assigned(tps):
        assigned.set()

    async def nothing(tps):
        pass

    consumer = GroupConsumer({"bootstrap.servers": bootstrap, "group.id": f"idle-{uuid.uuid4().hex[:8]}",
                              "session.timeout.ms": 6000}, topics,
                             on_assigned=on_assigned, on_revoked=nothing, on_lost=nothing)
    consumer.start(asyncio.get_running_loop(), lambda records: got.append(time.perf_counter()))
    try:
        await asyncio.wait_for(assigned.wait(), 30)
        await asyncio.sleep(IDLE_S)
        producer = Producer({"bootstrap.servers": bootstrap})
        started = time.perf_counter()
        for i in range(100):
            producer.produce(topics[i % len(topics)], b"x" * 200, key=str(i).encode())
        producer.flush(10)
        deadline = started + 10
        while not got and time.perf_counter() < deadline:
            await asyncio.sleep(0.005)
        assert got, "the idle consumer was handed nothing within 10 s"
        return got[0] - started
    finally:
        consumer.stop_polling()
        await asyncio.get_running_loop().run_in_executor(None, consumer.close)


def test_idle_consumer_hands_over_new_records_within_a_second(bootstrap):
    delays = []
    for _ in range(3):  # fresh topics each time: a new group reads from the start
        topics = [f"idle-wake-{uuid.uuid4().hex[:8]}-{i}" for i in range(TOPICS)]
        create_topics(bootstrap, topics, PARTITIONS)
        delays.append(asyncio.run(first_record_after_idle(bootstrap, topics)))
    # before the wake-up request every try took 1.4 s or more; after it, tens of milliseconds
    assert statistics.median(delays) < 0.9, f"first record after {[round(d, 3) for d in delays]} s"
