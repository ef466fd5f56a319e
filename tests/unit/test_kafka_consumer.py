"""modpipe.streams.kafka.consumer without a broker: the empty-fetch backoff, the configuration every worker consumer
gets, and the poll thread against a fake confluent-kafka Consumer (records to the loop, rebalance callbacks
run on the loop, pauses, seeks, a fatal error)."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError
from modpipe.streams.kafka import consumer as kc
from modpipe.streams.kafka.consumer import EMPTY_BACKOFF_MAX_S, EMPTY_BACKOFF_S, GroupConsumer, empty_backoff
from modpipe.streams.kafka.records import TP, Record


def test_no_backoff_after_a_fetch_that_brought_records():
    assert empty_backoff(0) == 0.0 and empty_backoff(-3) == 0.0


def test_the_backoff_doubles_up_to_its_cap():
    waits = [empty_backoff(n) for n in range(1, 12)]
    assert waits[:3] == pytest.approx([EMPTY_BACKOFF_S, 2 * EMPTY_BACKOFF_S, 4 * EMPTY_BACKOFF_S])
    assert waits == sorted(waits) and max(waits) == EMPTY_BACKOFF_MAX_S
    assert empty_backoff(10_000) == EMPTY_BACKOFF_MAX_S  # a long idle spell: no overflow


def test_the_backoff_stops_at_the_configured_cap_and_zero_means_none():
    assert max(empty_backoff(n, 0.01) for n in range(1, 12)) == 0.01
    assert empty_backoff(1, 0.01) == EMPTY_BACKOFF_S  # the first pause is the same whatever the cap
    assert [empty_backoff(n, 0.0) for n in range(1, 12)] == [0.0] * 11


def test_the_worker_consumer_reads_committed_and_commits_only_through_transactions():
    gc = GroupConsumer({"bootstrap.servers": "b:9092", "group.id": "g", "isolation.level": "read_uncommitted",
                        "enable.auto.commit": True, "auto.offset.reset": "latest"}, ["posts"],
                       on_assigned=None, on_revoked=None, on_lost=None)
    assert gc.conf["isolation.level"] == "read_committed"
    assert gc.conf["enable.auto.commit"] is False and gc.conf["enable.auto.offset.store"] is False
    assert gc.conf["partition.assignment.strategy"] == "range" and gc.conf["auto.offset.reset"] == "earliest"
    assert gc.conf["group.id"] == "g" and gc.group_metadata() is None  # no assignment yet


class FakeError:
    def __init__(self, code: int, fatal: bool = False):
        self._code, self._fatal = code, fatal

    def code(self):
        return self._code

    def fatal(self):
        return self._fatal

    def __str__(self):
        return f"error {self._code}"


class FakeMessage:
    def __init__(self, topic, partition, offset, value=b"v", timestamp=(1, 1_700_000_000_000), error=None):
        self._t, self._p, self._o, self._v, self._ts, self._e = topic, partition, offset, value, timestamp, error

    def error(self):
        return self._e

    def topic(self):
        return self._t

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def key(self):
        return b"k"

    def value(self):
        return self._v

    def timestamp(self):
        return self._ts


class FakeConsumer:
    """confluent_kafka.Consumer as the poll thread uses it. `script` holds what the next consume() calls
    return: a list of messages, or a function of the consumer (a rebalance callback runs inside consume)."""

    def __init__(self, conf):
        self.conf = conf
        self.script: collections.deque = collections.deque()
        self.calls: list[tuple] = []
        self.assigned: list = []
        self.positions: dict = {}  # (topic, partition) -> consumed position; others -1001 (none)
        self.thread: threading.Thread | None = None

    def subscribe(self, topics, on_assign, on_revoke, on_lost):
        self.topics, self.on_assign, self.on_revoke, self.on_lost = topics, on_assign, on_revoke, on_lost

    def consume(self, n, timeout):
        self.thread = threading.current_thread()
        if self.script:
            step = self.script.popleft()
            return (step(self) or []) if callable(step) else step
        time.sleep(min(timeout, 0.002))
        return []

    def assignment(self):
        return list(self.assigned)

    def pause(self, tps):
        self.calls.append(("pause", tuple(tps)))

    def resume(self, tps):
        self.calls.append(("resume", tuple(tps)))

    def seek(self, tp):
        self.calls.append(("seek", tp.topic, tp.partition, tp.offset, threading.current_thread().name))

    def position(self, tps):
        return [SimpleNamespace(topic=tp.topic, partition=tp.partition,
                                offset=self.positions.get((tp.topic, tp.partition), -1001)) for tp in tps]

    def committed(self, tps, timeout=None):
        return [SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=-1001) for tp in tps]

    def get_watermark_offsets(self, tp, cached=False, timeout=None):
        return 0, 0

    def consumer_group_metadata(self):
        return "group-metadata"

    def assign(self, tps):
        self.calls.append(("assign", tuple((tp.topic, tp.partition) for tp in tps)))

    def close(self):
        self.calls.append(("close",))


class PartitionStub:
    def __init__(self, topic, partition):
        self.topic, self.partition = topic, partition


@pytest.fixture
def fake_consumer(monkeypatch):
    made: list[FakeConsumer] = []

    def make(conf):
        made.append(FakeConsumer(conf))
        return made[-1]

    monkeypatch.setattr(kc, "Consumer", make)
    return made


async def until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def test_records_and_rebalances_reach_the_loop(fake_consumer):
    async def scenario():
        loop = asyncio.get_running_loop()
        events: list = []

        async def on_assigned(tps):
            events.append(("assigned", tps, threading.current_thread() is threading.main_thread()))
            await asyncio.sleep(0.01)  # the group waits for the callback
            events.append(("assigned-done",))

        async def on_revoked(tps):
            events.append(("revoked", tps))

        gc = GroupConsumer({"group.id": "g"}, ["posts", "features.user"], on_assigned=on_assigned,
                           on_revoked=on_revoked, on_lost=on_revoked)
        batches: list[list[Record]] = []

        def assign(c):
            c.assigned = [PartitionStub("posts", 0), PartitionStub("features.user", 0)]
            c.on_assign(c, c.assigned)
            events.append(("consume-returned",))

        def deliver(records):
            batches.append(records)

        gc.start(loop, deliver)
        fake = fake_consumer[0]
        fake.script.extend([
            assign,
            [FakeMessage("posts", 0, 5), FakeMessage("posts", 0, 6, timestamp=(0, -1)),
             FakeMessage("posts", 0, 7, error=FakeError(KafkaError._PARTITION_EOF)),
             FakeMessage("features.user", 0, 9, value=b"bundle")],
        ])
        await until(lambda: batches)
        gc.seek(TP("posts", 0), 3)
        await until(lambda: any(c[:4] == ("seek", "posts", 0, 3) for c in fake.calls))
        await loop.run_in_executor(None, gc.close)
        return gc, fake, events, batches

    gc, fake, events, batches = asyncio.run(scenario())
    assert fake.topics == ["posts", "features.user"] and fake.conf["isolation.level"] == "read_committed"
    assert events[0] == ("assigned", [TP("posts", 0), TP("features.user", 0)], True)  # on the loop's thread
    assert events[1:3] == [("assigned-done",), ("consume-returned",)]  # the poll thread waited for it
    assert gc.group_metadata() == "group-metadata"
    [records] = batches
    assert [(r.topic, r.partition, r.offset, r.value) for r in records] == \
        [("posts", 0, 5, b"v"), ("posts", 0, 6, b"v"), ("features.user", 0, 9, b"bundle")]
    assert records[0].timestamp_ms == 1_700_000_000_000 and records[1].timestamp_ms is None
    assert records[0].tp == TP("posts", 0) and records[0].message is records[0]
    assert ("seek", "posts", 0, 3, "group-consumer") in fake.calls  # done on the poll thread
    assert fake.calls[-1] == ("close",) and gc.failure is None


def test_partitions_held_at_their_assignment_are_assigned_paused_and_fetch_only_once_released(fake_consumer):
    """Their tables are restored off the callback: they are assigned paused inside it (before librdkafka
    fetches), no pause cycle or back-pressure resume wakes them, and `release` resumes them."""
    def touched(calls, tp) -> list[str]:
        return [c[0] for c in calls if c[0] in ("pause", "resume") and any(
            (x.topic, x.partition) == tp for x in c[1])]

    async def scenario():
        async def on_assigned(tps):
            return [tp for tp in tps if tp.partition == 1]

        gc = GroupConsumer({}, ["posts", "features.user"], on_assigned=on_assigned, on_revoked=None, on_lost=None)
        gc.start(asyncio.get_running_loop(), lambda records: None)
        fake = fake_consumer[0]

        def assign(c):
            c.assigned = [PartitionStub(t, p) for t in ("posts", "features.user") for p in (0, 1)]
            c.on_assign(c, c.assigned)

        fake.script.append(assign)
        await until(lambda: sum(c[0] == "resume" and any(x.partition == 0 for x in c[1]) for c in fake.calls) >= 3)
        before = list(fake.calls)
        gc.release([TP("posts", 1), TP("features.user", 1)])
        await until(lambda: touched(fake.calls[len(before):], ("posts", 1))[-1:] == ["resume"])
        await asyncio.get_running_loop().run_in_executor(None, gc.close)
        return fake, before

    fake, before = asyncio.run(scenario())
    assign_at = next(i for i, c in enumerate(before) if c[0] == "assign")
    assert sorted(before[assign_at][1]) == [("features.user", 0), ("features.user", 1), ("posts", 0), ("posts", 1)]
    assert before[assign_at + 1][0] == "pause" and \
        sorted((x.topic, x.partition) for x in before[assign_at + 1][1]) == [("features.user", 1), ("posts", 1)]
    for tp in (("posts", 1), ("features.user", 1)):
        assert "resume" not in touched(before, tp)  # the pause cycles of the others never woke it
    assert "resume" in touched(before, ("posts", 0))


def test_a_release_from_an_assignment_since_revoked_does_not_wake_the_next_assignments_held_partitions(
        fake_consumer):
    """The restore of the revoked assignment released its partitions just before the revocation; the command
    reaches the poll thread after the next assignment held the same partitions again (their restore just started)."""
    async def scenario():
        async def on_assigned(tps):
            return [tp for tp in tps if tp.partition == 1]

        async def on_revoked(tps):
            pass

        gc = GroupConsumer({}, ["posts"], on_assigned=on_assigned, on_revoked=on_revoked, on_lost=on_revoked)
        gc.start(asyncio.get_running_loop(), lambda records: None)
        fake = fake_consumer[0]

        def assign(c):
            c.assigned = [PartitionStub("posts", 0), PartitionStub("posts", 1)]
            c.on_assign(c, c.assigned)

        def release_revoke_assign(c):
            gc.release([TP("posts", 1)])  # the old restore, done just as its partitions go
            c.on_revoke(c, c.assigned)
            assign(c)
            c.calls.append(("reassigned",))

        fake.script.extend([assign, release_revoke_assign])
        await until(lambda: ("reassigned",) in fake.calls)
        await until(lambda: sum(c[0] == "resume" and any(x.partition == 0 for x in c[1])
                                for c in fake.calls[fake.calls.index(("reassigned",)):]) >= 3)
        await asyncio.get_running_loop().run_in_executor(None, gc.close)
        return fake

    fake = asyncio.run(scenario())
    after = fake.calls[fake.calls.index(("reassigned",)):]
    assert not [c for c in after if c[0] == "resume" and any(x.partition == 1 for x in c[1])]


def test_an_empty_fetch_pauses_the_assignment_for_a_moment(fake_consumer):
    async def scenario():
        gc = GroupConsumer({}, ["posts"], on_assigned=None, on_revoked=None, on_lost=None)
        gc.start(asyncio.get_running_loop(), lambda records: None)
        fake = fake_consumer[0]
        fake.assigned = [PartitionStub("posts", 1)]
        await until(lambda: sum(c[0] == "resume" for c in fake.calls) >= 3)
        await asyncio.get_running_loop().run_in_executor(None, gc.close)
        return fake

    fake = asyncio.run(scenario())
    # the poll thread may pause the empty assignment it saw before the partition was assigned (a resume of
    # nothing calls nothing): the cycle is the one of the assigned partition
    cycle = [c[0] for c in fake.calls if c[0] in ("pause", "resume") and c[1]]
    assert cycle[:6] == ["pause", "resume"] * 3


def test_lag_is_reported_at_an_assignment_and_then_every_few_seconds_not_every_fetch(fake_consumer, monkeypatch):
    """Each report reads every assigned partition's position and watermarks and sets a gauge per partition: at
    every fetch cycle (40 a second on an idle worker) that was a share of the idle worker's CPU."""
    monkeypatch.setattr(kc, "LAG_EVERY_S", 0.25)
    monkeypatch.setattr(kc, "ASSIGNMENT_GRACE_S", 0.0)  # the idle fetch cycle (pause, resume) from the start

    async def scenario():
        async def on_assigned(tps):
            pass

        gc = GroupConsumer({}, ["posts"], on_assigned=on_assigned, on_revoked=None, on_lost=None)
        gc.start(asyncio.get_running_loop(), lambda records: None)
        fake = fake_consumer[0]
        reports: list[float] = []
        position = fake.position
        fake.position = lambda tps: (reports.append(time.monotonic()), position(tps))[1]
        assigned: list[float] = []

        def assign(c):
            c.assigned = [PartitionStub("posts", 1)]
            assigned.append(time.monotonic())
            c.on_assign(c, c.assigned)

        await asyncio.sleep(0.05)  # the loop's first report (nothing assigned) is behind it
        fake.script.append(assign)
        await until(lambda: assigned)
        await asyncio.sleep(1.0)
        await asyncio.get_running_loop().run_in_executor(None, gc.close)
        return fake, reports, assigned[0]

    fake, reports, assigned_at = asyncio.run(scenario())
    after = [t for t in reports if t >= assigned_at]
    assert after and after[0] - assigned_at < 0.2  # the new partition's series right after the assignment
    cycles = sum(c[0] == "resume" and bool(c[1]) for c in fake.calls)
    assert cycles >= 10  # the fetch cycle went round many times...
    assert 3 <= len(after) <= 6  # ...and the lag was read every 0.25 s of the ~1 s, not at each cycle
    gaps = [b - a for a, b in zip(after[:-1], after[1:], strict=True)]
    assert min(gaps) >= 0.2


def start_on_long_polled_fetches(fake_consumer) -> tuple[GroupConsumer, FakeConsumer, list[int]]:
    """A consumer with both pauses at zero (Apache Kafka's defaults), assigned posts[1]; the sizes of the batches
    it delivers. Call on the loop."""
    gc = GroupConsumer({}, ["posts"], on_assigned=None, on_revoked=None, on_lost=None, fetch_pause_s=0.0,
                       idle_pause_max_s=0.0)
    delivered: list[int] = []
    gc.start(asyncio.get_running_loop(), lambda records: delivered.append(len(records)))
    fake = fake_consumer[-1]
    fake.assigned = [PartitionStub("posts", 1)]
    return gc, fake, delivered


def test_with_both_pauses_at_zero_an_idle_assignment_is_never_paused(fake_consumer):
    """For a broker that holds an empty fetch until data comes: librdkafka's fetches do the waiting."""
    async def scenario():
        gc, fake, delivered = start_on_long_polled_fetches(fake_consumer)
        fake.script.extend([[]] * 20 + [[FakeMessage("posts", 1, 0)]] + [[]] * 20)
        await until(lambda: delivered and not fake.script)
        await asyncio.get_running_loop().run_in_executor(None, gc.close)
        return fake, delivered

    fake, delivered = asyncio.run(scenario())
    assert delivered == [1]
    assert not [c for c in fake.calls if c[0] in ("pause", "resume") and c[1]]


def test_the_idle_fetch_wait_doubles_from_the_fetch_window_to_its_cap():
    waits = [kc.idle_fetch_wait(n) for n in range(0, 12)]
    assert waits[0] == kc.FETCH_WAIT_S and waits[1] == 2 * kc.FETCH_WAIT_S
    assert waits == sorted(waits) and max(waits) == kc.IDLE_FETCH_WAIT_MAX_S
    assert kc.idle_fetch_wait(10_000) == kc.IDLE_FETCH_WAIT_MAX_S


def test_an_idle_consumer_on_long_polled_fetches_waits_longer_and_a_record_brings_the_short_window_back(
        fake_consumer, monkeypatch):
    """An idle worker's thread woke every FETCH_WAIT_S (100 times a second): about half of an idle worker's CPU."""
    monkeypatch.setattr(kc, "ASSIGNMENT_GRACE_S", 0.0)

    async def scenario():
        gc, fake, delivered = start_on_long_polled_fetches(fake_consumer)
        timeouts: list[float] = []
        consume = fake.consume

        def recorded(n, timeout):
            if n == 1:  # a window's first wait
                timeouts.append(timeout)
            return consume(n, timeout)

        fake.consume = recorded
        await until(lambda: len(timeouts) >= 12)
        at_cap = len(timeouts)
        fake.script.extend([[FakeMessage("posts", 1, 0)], []])
        await until(lambda: delivered and len(timeouts) >= at_cap + 3)
        await asyncio.get_running_loop().run_in_executor(None, gc.close)
        return timeouts, at_cap, delivered

    timeouts, at_cap, delivered = asyncio.run(scenario())
    assert delivered == [1]
    idle = timeouts[:at_cap]
    assert max(idle) == kc.IDLE_FETCH_WAIT_MAX_S and idle == sorted(idle), idle
    after = timeouts[at_cap:]
    # the window that brought the record, then the short window again
    assert kc.FETCH_WAIT_S in after[1:3], after


def test_a_fetch_that_brought_records_pauses_the_assignment_for_the_fetch_pause(fake_consumer):
    """Under load every fetch brings records: without this pause librdkafka would fetch in a tight loop."""
    def pauses_before_each_window(fetch_pause_s):
        """How many pauses of the assignment the poll thread had made when each of 3 windows began."""
        async def scenario():
            gc = GroupConsumer({}, ["posts"], on_assigned=None, on_revoked=None, on_lost=None,
                               fetch_pause_s=fetch_pause_s)
            delivered: list[int] = []
            seen: list[int] = []
            gc.start(asyncio.get_running_loop(), lambda records: delivered.append(len(records)))
            fake = fake_consumer[-1]
            fake.assigned = [PartitionStub("posts", 1)]

            def window(n):
                def step(c):
                    seen.append(sum(1 for call in c.calls if call[0] == "pause" and call[1]))
                    return [FakeMessage("posts", 1, n)]
                return step

            # each window: its first record, then nothing more queued (one extend: the thread sees all at once)
            fake.script.extend([window(0), [], window(1), [], window(2), []])
            await until(lambda: len(delivered) == 3)
            await asyncio.get_running_loop().run_in_executor(None, gc.close)
            return seen

        return asyncio.run(scenario())

    seen = pauses_before_each_window(0.01)
    assert [b - a for a, b in zip(seen, seen[1:], strict=False)] == [1, 1]  # one pause after each window
    seen = pauses_before_each_window(0.0)
    assert seen[2] == seen[0]  # 0: the next fetch at once (a broker that waits for data)


def test_a_resume_seeks_back_only_for_a_seek_of_its_own_that_has_not_taken_effect(fake_consumer):
    """A position ahead of the last record + 1 is a transaction marker the consumer went past (not sought back
    to, at every resume, as before), unless the worker itself sought back there and no record or end of
    partition has come from the new position yet."""
    async def scenario():
        gc = GroupConsumer({}, ["posts"], on_assigned=None, on_revoked=None, on_lost=None, fetch_pause_s=0.005,
                           idle_pause_max_s=0.005)
        delivered: list[int] = []
        gc.start(asyncio.get_running_loop(), lambda records: delivered.extend(r.offset for r in records))
        fake = fake_consumer[-1]
        fake.assigned = [PartitionStub("posts", 1)]

        def seeks():
            return [c[3] for c in fake.calls if c[0] == "seek"]

        def resumes():
            return sum(1 for c in fake.calls if c[0] == "resume")

        fake.positions[("posts", 1)] = 6  # record 4, then a commit marker at 5
        fake.script.append([FakeMessage("posts", 1, 4)])
        await until(lambda: delivered == [4])
        after = resumes()
        await until(lambda: resumes() >= after + 3)
        marker_seeks = seeks()

        gc.seek(TP("posts", 1), 2)  # a rewind: its position still reads 6 until the fetcher takes the seek
        await until(lambda: len(seeks()) >= 3)  # the seek itself, then again at each resume
        rewind_seeks = seeks()

        fake.positions[("posts", 1)] = 4  # record 2 arrives from the new position, then a marker at 3
        fake.script.append([FakeMessage("posts", 1, 2)])
        await until(lambda: delivered == [4, 2])
        settled = len(seeks())
        after = resumes()
        await until(lambda: resumes() >= after + 3)
        await asyncio.get_running_loop().run_in_executor(None, gc.close)
        return marker_seeks, rewind_seeks, seeks()[settled:], gc

    marker_seeks, rewind_seeks, later_seeks, gc = asyncio.run(scenario())
    assert marker_seeks == []
    assert set(rewind_seeks) == {2}
    assert later_seeks == [] and gc._next[TP("posts", 1)] == 4  # the marker's position taken as the next offset


def test_a_fetch_that_brought_a_backlog_is_followed_by_the_next_at_once(fake_consumer):
    async def scenario():
        gc = GroupConsumer({}, ["posts"], on_assigned=None, on_revoked=None, on_lost=None, fetch_pause_s=10.0)
        delivered: list[int] = []
        gc.start(asyncio.get_running_loop(), lambda records: delivered.append(len(records)))
        fake = fake_consumer[-1]
        fake.assigned = [PartitionStub("posts", 1)]
        backlog = [FakeMessage("posts", 1, n) for n in range(kc.BACKLOG_RECORDS)]
        fake.script.extend([backlog[:1], backlog[1:], backlog[:1], backlog[1:]])
        await until(lambda: len(delivered) == 2, timeout_s=2.0)  # a 10 s pause between them would fail this
        await asyncio.get_running_loop().run_in_executor(None, gc.close)
        return fake, delivered

    fake, delivered = asyncio.run(scenario())
    assert delivered == [kc.BACKLOG_RECORDS, kc.BACKLOG_RECORDS]


def test_back_pressure_pauses_until_the_wiring_catches_up(fake_consumer):
    async def scenario():
        gc = GroupConsumer({}, ["posts"], on_assigned=None, on_revoked=None, on_lost=None)
        busy = [True]
        gc.busy = lambda: busy[0]
        gc.start(asyncio.get_running_loop(), lambda records: None)
        fake = fake_consumer[0]
        fake.assigned = [PartitionStub("posts", 1)]
        await asyncio.sleep(0.1)
        paused = list(fake.calls)
        busy[0] = False
        await until(lambda: len(fake.calls) > len(paused))
        await asyncio.get_running_loop().run_in_executor(None, gc.close)
        return paused, fake

    paused, fake = asyncio.run(scenario())
    # one pause while busy, and nothing else meanwhile (no empty-fetch pause/resume cycles either)
    assert [c[0] for c in paused] == ["pause"]
    assert fake.calls[1][0] == "resume"


def test_a_fatal_error_stops_polling_and_is_reported_on_the_loop(fake_consumer):
    async def scenario():
        loop = asyncio.get_running_loop()
        failures: list = []
        gc = GroupConsumer({}, ["posts"], on_assigned=None, on_revoked=None, on_lost=None)
        gc.on_failure = lambda exc: failures.append((exc, threading.current_thread() is threading.main_thread()))
        gc.start(loop, lambda records: None)
        fake_consumer[0].script.append([FakeMessage("posts", 0, 1, error=FakeError(KafkaError._FENCED, fatal=True))])
        await until(lambda: failures)
        await loop.run_in_executor(None, gc.close)
        return gc, failures

    gc, failures = asyncio.run(scenario())
    assert gc.failure is not None and not gc.alive()
    assert len(failures) == 1 and failures[0][1]


def test_a_consumer_without_an_assignment_says_so_until_it_gets_one(fake_consumer, monkeypatch, caplog):
    monkeypatch.setattr(kc, "UNASSIGNED_WARN_S", 0.05)

    async def scenario():
        loop = asyncio.get_running_loop()

        async def on_assigned(tps):
            pass

        gc = GroupConsumer({"group.id": "g"}, ["posts"], on_assigned=on_assigned, on_revoked=on_assigned,
                           on_lost=on_assigned, rejoin_after_s=0)  # rejoining off: warnings only
        gc.start(loop, lambda records: None)
        warned = lambda: [r for r in caplog.records if r.getMessage() == "no assignment from the group yet"]  # noqa: E731
        await until(lambda: len(warned()) >= 2)  # again after each interval, not once

        def assign(c):
            c.assigned = [PartitionStub("posts", 0)]
            c.on_assign(c, c.assigned)

        fake_consumer[0].script.append(assign)
        await until(lambda: not fake_consumer[0].script)
        await asyncio.sleep(0.05)
        seen = len(warned())
        await asyncio.sleep(0.2)  # four intervals with an assignment
        await loop.run_in_executor(None, gc.close)
        return seen, len(warned())

    with caplog.at_level("WARNING", logger="modpipe.streams.kafka.consumer"):
        seen, after = asyncio.run(scenario())
    assert seen >= 2 and after == seen
    assert len(fake_consumer) == 1  # warned, never replaced


def test_a_join_the_group_leaves_unanswered_is_left_for_a_new_consumer(fake_consumer):
    """The embedded broker once left two joining members without an answer; librdkafka would wait on it for
    max.poll.interval.ms. After `rejoin_after_s` without an assignment the consumer is replaced, an answer
    reaching the replaced one is ignored, and the wait starts again at each revocation."""
    events: list = []

    async def scenario():
        loop = asyncio.get_running_loop()

        async def on_assigned(tps):
            events.append(("assigned", tps))

        async def on_revoked(tps):
            events.append(("revoked", tps))

        gc = GroupConsumer({"group.id": "g", "group.instance.id": "g-w0"}, ["posts"], on_assigned=on_assigned,
                           on_revoked=on_revoked, on_lost=on_revoked, rejoin_after_s=0.15)
        rejoins_before = kc.metrics.GROUP_REJOINS._value.get()
        started = time.monotonic()
        gc.start(loop, lambda records: None)
        await until(lambda: len(fake_consumer) == 2)
        waited = time.monotonic() - started
        first, second = fake_consumer
        assert ("close",) in first.calls and second.topics == ["posts"] and second.conf == first.conf

        def assign(c):
            c.assigned = [PartitionStub("posts", 0)]
            c.on_assign(c, c.assigned)

        second.script.append(assign)
        await until(lambda: events)
        first.on_assign(first, [PartitionStub("posts", 1)])  # the old join's answer, late: not ours
        first.on_revoke(first, [PartitionStub("posts", 1)])
        await asyncio.sleep(0.4)  # well past rejoin_after_s, assigned: no new consumer
        assigned_count = len(fake_consumer)

        def revoke(c):
            c.on_revoke(c, c.assigned)
            c.assigned = []

        second.script.append(revoke)
        await until(lambda: len(fake_consumer) == 3)  # unanswered again after the revocation
        await loop.run_in_executor(None, gc.close)
        return gc, waited, assigned_count, kc.metrics.GROUP_REJOINS._value.get() - rejoins_before

    gc, waited, assigned_count, counted = asyncio.run(scenario())
    assert waited >= 0.15
    assert events == [("assigned", [TP("posts", 0)]), ("revoked", [TP("posts", 0)])]
    assert assigned_count == 2
    assert gc.rejoins == 2 and counted == 2
    assert gc.group_metadata() == "group-metadata"


def _rebalance_test(fake_consumer, steps):
    """Runs `steps` (FakeConsumer scripts, given the consumer) through a GroupConsumer; returns what reached the
    loop, the rebalance events in order, and the fake."""
    async def scenario():
        loop = asyncio.get_running_loop()
        events: list = []

        async def on_assigned(tps):
            events.append(("assigned", tps))

        async def on_revoked(tps):
            events.append(("revoked", tps))

        gc = GroupConsumer({"group.id": "g"}, ["posts"], on_assigned=on_assigned, on_revoked=on_revoked,
                           on_lost=on_revoked)
        batches: list[list[Record]] = []
        gc.start(loop, lambda records: (batches.append(records), events.append(("records", len(records)))))
        fake = fake_consumer[0]
        fake.script.extend(steps)
        await until(lambda: not fake.script)
        await asyncio.sleep(0.05)
        await loop.run_in_executor(None, gc.close)
        return gc, fake, events, batches

    return asyncio.run(scenario())


def assign_posts(*partitions):
    def assign(c):
        c.assigned = [PartitionStub("posts", p) for p in partitions]
        c.on_assign(c, c.assigned)
    return assign


def test_records_a_fetch_brought_from_before_a_revocation_never_reach_the_loop(fake_consumer):
    """librdkafka serves the revocation inside `consume`, and that call may still return records fetched for
    the old assignment: handed over after the revocation, they started rounds on partitions the worker no
    longer owned (the next checkpoint failed with ILLEGAL_GENERATION and the worker stopped)."""
    def revoke_then_return_old_records(c):
        old = c.assigned
        c.assigned = []
        c.on_revoke(c, old)
        return [FakeMessage("posts", 0, 7), FakeMessage("posts", 1, 3),
                FakeMessage("posts", 1, 4, error=FakeError(KafkaError._PARTITION_EOF))]

    gc, fake, events, batches = _rebalance_test(fake_consumer, [
        assign_posts(0, 1),
        [FakeMessage("posts", 0, 5), FakeMessage("posts", 0, 6),
         FakeMessage("posts", 1, 3, error=FakeError(KafkaError._PARTITION_EOF))], [],  # one whole fetch window
        revoke_then_return_old_records, [], assign_posts(1), [FakeMessage("posts", 1, 3)]])
    assert [[(r.partition, r.offset) for r in b] for b in batches] == [[(0, 5), (0, 6)], [(1, 3)]]
    assert [e[0] for e in events] == ["assigned", "records", "revoked", "assigned", "records"]
    assert gc.dropped_after_revocation == 2 and gc.failure is None
    # assigned in a later fetch: nothing to read again (a resume seeks only partitions that delivered since)
    assert not any(c[0] == "seek" for c in fake.calls), fake.calls


def revoke_assign_and_return_mixed_records(c):
    """One fetch in which posts/1 is revoked and assigned again: its records and another partition's come back."""
    old = c.assigned
    c.assigned = []
    c.on_revoke(c, old)
    c.assigned = [PartitionStub("posts", 1)]
    c.on_assign(c, c.assigned)
    return [FakeMessage("posts", 1, 3), FakeMessage("posts", 0, 9), FakeMessage("posts", 1, 4)]


def test_a_partition_assigned_again_in_the_same_fetch_is_read_again_from_where_its_assignment_starts(fake_consumer):
    committed = {("posts", 1): 3}

    def committed_offsets(tps, timeout=None):
        return [SimpleNamespace(topic=tp.topic, partition=tp.partition,
                                offset=committed.get((tp.topic, tp.partition), -1001)) for tp in tps]

    def steps_with_committed(c):
        c.committed = committed_offsets
        assign_posts(0, 1)(c)

    gc, fake, events, batches = _rebalance_test(fake_consumer, [
        steps_with_committed, revoke_assign_and_return_mixed_records, [], [FakeMessage("posts", 1, 3)]])
    assert [[(r.partition, r.offset) for r in b] for b in batches] == [[(1, 3)]]
    seeks = [c[1:4] for c in fake.calls if c[0] == "seek"]
    assert seeks[0] == ("posts", 1, 3)  # its committed offset: what the window brought comes again, once
    assert gc.dropped_after_revocation == 3 and gc.failure is None


async def _polling(fake_consumer) -> GroupConsumer:
    """A GroupConsumer whose poll thread is running on the fake."""
    async def nothing(tps):
        return None

    gc = GroupConsumer({"group.id": "g"}, ["posts"], on_assigned=nothing, on_revoked=nothing, on_lost=nothing)
    gc.start(asyncio.get_running_loop(), lambda records: None)
    await until(lambda: fake_consumer and fake_consumer[0].thread is not None)
    return gc


def test_leaving_the_group_waits_a_bounded_time_for_a_close_that_never_returns(fake_consumer):
    """librdkafka's close waits for the group's answers and has been seen to block for good; asyncio.run then
    waited on the executor thread for ever (a CI run hung in tests/integration/test_group_rejoin.py)."""
    release = threading.Event()

    async def scenario():
        gc = await _polling(fake_consumer)
        fake_consumer[0].close = lambda: release.wait(30)  # a close that does not return
        started = time.monotonic()
        left = await asyncio.get_running_loop().run_in_executor(None, gc.close, 0.3)
        return left, time.monotonic() - started

    try:
        left, took = asyncio.run(scenario())
    finally:
        release.set()
    assert left is False and 0.3 <= took < 5


def test_leaving_the_group_says_so_when_the_close_returns(fake_consumer):
    async def scenario():
        gc = await _polling(fake_consumer)
        return await asyncio.get_running_loop().run_in_executor(None, gc.close)

    assert asyncio.run(scenario()) is True
    assert ("close",) in fake_consumer[0].calls


def test_the_quiet_partitions_ends_are_asked_without_waiting_and_a_stalled_one_is_sought_once_they_are_in():
    """Each end is a broker round trip: asked on the poll thread one after another (`get_watermark_offsets`) they
    held the fetching of every partition for up to ~1.5 s. They are asked in one request whose answers the poll
    thread picks up at a later turn; the seek of a stalled partition then happens there."""
    import concurrent.futures

    gc = GroupConsumer({"bootstrap.servers": "b:9092", "group.id": "g"}, ["posts"], on_assigned=None,
                       on_revoked=None, on_lost=None, stall_s=1.0)
    stalled, idle = TP("reports", 0), TP("labels", 1)
    now = time.monotonic()
    gc._assigned_at = now - 100
    gc.stall_watch.assigned([stalled, idle], {stalled: 5, idle: 7}, now - 100)  # both quiet for 100 s
    answers, seeks = {}, []

    class Admin:
        def poll(self, timeout):
            assert timeout == 0

        def list_offsets(self, specs, isolation_level, request_timeout):
            assert isolation_level == kc.IsolationLevel.READ_COMMITTED
            for ctp in specs:
                answers[TP(ctp.topic, ctp.partition)] = concurrent.futures.Future()
            return {ctp: answers[TP(ctp.topic, ctp.partition)] for ctp in specs}

    class Polled:
        def get_watermark_offsets(self, tp, timeout):  # the poll thread waits for no broker
            raise AssertionError("an end asked on the poll thread")

        def resume(self, tps):
            pass

        def seek(self, ctp):
            seeks.append((ctp.topic, ctp.partition, ctp.offset))

    gc._admin, consumer = Admin(), Polled()
    gc._watch_stalls(consumer, held=False)  # asks, and returns with the answers still out
    assert set(answers) == {stalled, idle} and not seeks
    gc._watch_stalls(consumer, held=False)
    assert not seeks  # still out: the poll thread goes on fetching
    answers[stalled].set_result(SimpleNamespace(offset=10))  # records past what it delivered (5)
    answers[idle].set_result(SimpleNamespace(offset=7))  # at its end: idle, not stalled
    gc._watch_stalls(consumer, held=False)
    assert seeks == [("reports", 0, 5)]  # the stalled one, from where it stopped


def _committed_answers(answers):
    """A `committed()` that gives `answers` in turn: an exception is raised, a dict {(topic, partition): offset or
    (offset, metadata)} answered (absent: -1001), a string is a per-partition error; the last one stays."""
    from confluent_kafka import KafkaException

    asked: list[float] = []

    def committed(tps, timeout=None):
        asked.append(timeout)
        answer = answers[min(len(asked), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, str):
            return [SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=-1001, metadata=None,
                                    error=KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT, answer)) for tp in tps]
        out = []
        for tp in tps:
            got = answer.get((tp.topic, tp.partition), -1001)
            offset, metadata = got if isinstance(got, tuple) else (got, None)
            out.append(SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=offset, metadata=metadata,
                                       error=None))
        return out

    committed.asked = asked
    committed.timeout = KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get committed offsets"))
    return committed


def test_a_committed_offsets_failure_never_replays_a_partition_from_its_log_start(fake_consumer, monkeypatch):
    """`committed()` failed in the assignment callback (a timeout: offsets held by an open transaction), the error
    was swallowed, and a partition revoked and assigned again inside one fetch window was then sought to the start
    of its log: every record of it processed again. The assignment now waits and asks again until it has them."""
    monkeypatch.setattr(kc, "COMMITTED_RETRY_S", 0.01)
    committed = _committed_answers([{("posts", 1): 3}, _committed_answers([]).timeout, "offsets still pending",
                                    {("posts", 1): (3, "m")}])

    def steps_with_committed(c):
        c.committed = committed
        assign_posts(0, 1)(c)

    gc, fake, events, batches = _rebalance_test(fake_consumer, [
        steps_with_committed, revoke_assign_and_return_mixed_records, [], [FakeMessage("posts", 1, 3)]])
    seeks = [c[1:4] for c in fake.calls if c[0] == "seek"]
    assert seeks and all(offset >= 0 for _, _, offset in seeks), seeks  # never OFFSET_BEGINNING (-2)
    assert seeks[0] == ("posts", 1, 3)
    assert len(committed.asked) == 4 and gc.failure is None  # asked again until answered
    assert [e[0] for e in events] == ["assigned", "revoked", "assigned", "records"]
    assert gc.committed_at_assignment() == {TP("posts", 1): (3, "m")}


def test_committed_offsets_that_cannot_be_read_fail_the_assignment_loudly(fake_consumer, monkeypatch, caplog):
    monkeypatch.setattr(kc, "COMMITTED_RETRY_S", 0.01)
    monkeypatch.setattr(kc, "COMMITTED_ASK_S", 0.01)
    monkeypatch.setattr(kc, "COMMITTED_WAIT_S", 0.2)
    committed = _committed_answers([_committed_answers([]).timeout])

    def assign_failing(c):
        c.committed = committed
        assign_posts(0)(c)

    events: list = []

    async def scenario():
        async def on_assigned(tps):
            events.append(("assigned", tps))

        gc = GroupConsumer({"group.id": "g"}, ["posts"], on_assigned=on_assigned, on_revoked=on_assigned,
                           on_lost=on_assigned)
        gc.on_failure = lambda exc: events.append(("failed", type(exc).__name__))
        gc.start(asyncio.get_running_loop(), lambda records: events.append(("records", records)))
        fake_consumer[0].script.extend([assign_failing, [FakeMessage("posts", 0, 0)]])
        await until(lambda: gc.failure is not None)
        await asyncio.sleep(0.01)
        await asyncio.get_running_loop().run_in_executor(None, gc.close)
        return gc, fake_consumer[0]

    gc, fake = asyncio.run(scenario())
    assert isinstance(gc.failure, kc.CommittedOffsetsUnknown)
    # no restore, no record: the worker stops (and its restart joins the group again)
    assert events == [("failed", "CommittedOffsetsUnknown")]
    assert not any(c[0] == "seek" for c in fake.calls)
    assert len(committed.asked) >= 2
    assert any(r.levelname == "ERROR" and "committed offsets cannot be read" in r.getMessage() for r in caplog.records)
