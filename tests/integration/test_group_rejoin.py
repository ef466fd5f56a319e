"""A worker consumer the group leaves without an assignment joins again with a new consumer, on the real broker.

librdkafka waits on a JoinGroup request for max.poll.interval.ms (15 min for the workers, so that a restore can
run inside the assignment callback). The embedded broker once left two static members that joined together
without an answer (docs/faults.md); that stall is rare (about 1 in 150 fresh joins of two members), so this
test holds a join up on purpose: a member of the group that has partitions and stops polling. The broker waits
for it to rejoin until its max.poll.interval.ms runs out (librdkafka then leaves the group for it), and our
consumer, with MODPIPE_GROUP_REJOIN_S short, is replaced meanwhile: the replacements keep waiting like the
first, and once the stuck member is gone one of them gets every partition and the records; nothing reaches the
wiring from a consumer that was left."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from modpipe.streams.kafka.consumer import GroupConsumer
from modpipe.streams.kafka.records import TP

from tests.fixtures.kafka import create_topics

pytestmark = pytest.mark.integration

PARTITIONS = 2
STUCK_POLL_INTERVAL_S = 12  # the stuck member's max.poll.interval.ms: how long it holds the group up
REJOIN_AFTER_S = 3.0


def stuck_member(bootstrap: str, group: str, topic: str, has_partitions: threading.Event) -> Consumer:
    """A member that takes its assignment and never polls again (a worker frozen in a callback)."""
    # dynamic: librdkafka sends LeaveGroup for it when its poll interval runs out (a static member that
    # stopped polling held the embedded broker's group up for over 50 s, rejoins or not)
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 6000,
                       "heartbeat.interval.ms": 1000, "max.poll.interval.ms": STUCK_POLL_INTERVAL_S * 1000,
                       "isolation.level": "read_committed"})
    member.subscribe([topic], on_assign=lambda c, ps: has_partitions.set())
    deadline = time.monotonic() + 30
    while not has_partitions.is_set():
        assert time.monotonic() < deadline, "the stuck member got no assignment"
        member.poll(0.1)
    return member


def close_within(member: Consumer, timeout_s: float) -> None:
    """Close the stuck member on a thread of its own, waiting at most `timeout_s`: librdkafka's close of a member
    that its poll interval already took out of the group has been seen to block for good (once in a fresh clone),
    and that member is the test's tool, not what it tests."""
    closer = threading.Thread(target=member.close, name="close-stuck-member", daemon=True)
    closer.start()
    closer.join(timeout_s)


def test_a_consumer_left_without_an_assignment_joins_again_and_gets_the_partitions(bootstrap):
    topic, group = f"rejoin-{uuid.uuid4().hex[:8]}", f"rejoin-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], PARTITIONS)
    member = stuck_member(bootstrap, group, topic, threading.Event())
    events: list = []
    got: list = []

    async def scenario():
        loop = asyncio.get_running_loop()

        async def on_assigned(tps):
            events.append(("assigned", sorted(tps), time.monotonic()))

        async def on_revoked(tps):
            events.append(("revoked", sorted(tps), time.monotonic()))

        consumer = GroupConsumer({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 6000,
                                  "heartbeat.interval.ms": 1000, "group.instance.id": f"{group}-w0"}, [topic],
                                 on_assigned=on_assigned, on_revoked=on_revoked, on_lost=on_revoked,
                                 rejoin_after_s=REJOIN_AFTER_S)
        started = time.monotonic()
        consumer.start(loop, got.extend)
        try:
            deadline = started + STUCK_POLL_INTERVAL_S + 40
            while not any(e[0] == "assigned" and len(e[1]) == PARTITIONS for e in events):
                assert time.monotonic() < deadline, f"no full assignment: {events}, {consumer.rejoins} rejoins"
                await asyncio.sleep(0.1)
            producer = Producer({"bootstrap.servers": bootstrap})
            for i in range(20):
                producer.produce(topic, b"x", key=str(i).encode(), partition=i % PARTITIONS)
            producer.flush(10)
            while len(got) < 20:
                assert time.monotonic() < deadline, f"{len(got)} of 20 records"
                await asyncio.sleep(0.05)
            return consumer.rejoins, started
        finally:
            consumer.stop_polling()
            await loop.run_in_executor(None, consumer.close)

    try:
        rejoins, started = asyncio.run(scenario())
    finally:
        close_within(member, 30)
    assert rejoins >= 1  # the stuck member held the first join up past REJOIN_AFTER_S
    full = [e for e in events if e[0] == "assigned" and len(e[1]) == PARTITIONS]
    assert full[0][2] - started >= REJOIN_AFTER_S
    assert full[-1][1] == [TP(topic, p) for p in range(PARTITIONS)]
    # what the wiring was told adds up: every assignment it saw was revoked before the next one
    held: set = set()
    for kind, tps, _ in events:
        if kind == "assigned":
            assert not held & set(tps), events
            held |= set(tps)
        else:
            held -= set(tps)
    assert sorted({r.offset for r in got if r.partition == 0}) == list(range(10))
    assert len(got) == 20
