"""A partition that stops fetching is found and fetched again, on the real broker.

After node kills and rebalances, a worker has been seen holding partitions it never fetched again (docs/faults.md).
Here one partition is paused behind the group consumer's back, which stops its fetches exactly so: the
consumer's stall watch (streams/kafka/stalls.py) must find it once it has records it did not deliver, seek it
back to where it stopped and deliver every record once, in order; paused again after that, the consumer fails
(the worker restarts with a new consumer)."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Producer, TopicPartition
from modpipe.streams import metrics
from modpipe.streams.kafka.consumer import GroupConsumer

from tests.fixtures.kafka import create_topics

pytestmark = pytest.mark.integration

STALL_S = 3.0


async def run(bootstrap: str, topic: str) -> tuple[dict, float, Exception | None]:
    got: dict[int, list[int]] = {0: [], 1: []}
    assigned = asyncio.Event()
    failed: list[Exception] = []

    async def on_assigned(tps):
        assigned.set()

    async def nothing(tps):
        pass

    def deliver(records):
        for r in records:
            got[r.partition].append(r.offset)

    consumer = GroupConsumer({"bootstrap.servers": bootstrap, "group.id": f"stall-{uuid.uuid4().hex[:8]}",
                              "session.timeout.ms": 6000}, [topic],
                             on_assigned=on_assigned, on_revoked=nothing, on_lost=nothing, stall_s=STALL_S,
                             idle_pause_max_s=0.0)  # the defaults on Apache Kafka: never paused for pacing
    consumer.on_failure = failed.append
    consumer.start(asyncio.get_running_loop(), deliver)
    producer = Producer({"bootstrap.servers": bootstrap})

    def produce(n: int) -> None:
        for _ in range(n):
            for p in (0, 1):
                producer.produce(topic, b"x", partition=p)
        producer.flush(10)

    async def until(cond, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not cond() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return cond()

    before = metrics.FETCH_STALLS.labels(topic)._value.get()
    try:
        await asyncio.wait_for(assigned.wait(), 30)
        produce(10)
        assert await until(lambda: len(got[0]) == 10 and len(got[1]) == 10, 15), got
        # partition 0 stops fetching behind the consumer's back (its own poll thread runs the command)
        consumer._commands.append(lambda c: c.pause([TopicPartition(topic, 0)]))
        await asyncio.sleep(1.0)
        stopped = time.monotonic()
        produce(10)
        assert await until(lambda: len(got[1]) == 20, 15), got
        assert await until(lambda: len(got[0]) == 20, 4 * STALL_S + 10), f"partition 0 never fetched again: {got}"
        found_after = time.monotonic() - stopped
        stalls = metrics.FETCH_STALLS.labels(topic)._value.get() - before
        assert stalls == 1
        # stalled again after that seek: the consumer fails
        consumer._commands.append(lambda c: c.pause([TopicPartition(topic, 0)]))
        await asyncio.sleep(1.0)
        produce(5)
        assert await until(lambda: bool(failed), 4 * STALL_S + 10), "a second stall did not fail the consumer"
        return got, found_after, failed[0]
    finally:
        consumer.stop_polling()
        await asyncio.get_running_loop().run_in_executor(None, consumer.close)


def test_a_partition_that_stops_fetching_is_sought_again_then_fails_the_consumer(bootstrap):
    topic = f"stall-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], 2)
    got, found_after, failure = asyncio.run(run(bootstrap, topic))
    assert got[0][:20] == list(range(20)) and got[1][:20] == list(range(20))  # each record once, in order
    assert STALL_S <= found_after <= 3 * STALL_S + 5, found_after
    assert "is not fetched" in str(failure)
