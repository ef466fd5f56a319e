"""The worker's one consumer in the group (confluent-kafka), polled on a thread of its own.

It hands records to the event loop in batches (what one `consume()` brought), and runs the group's
rebalance callbacks on the loop, waiting for them: a revocation returns only once the wiring has committed
(or given up) what it did with the partitions, and only then does librdkafka let the group move them.

Reading is `read_committed`: transactional producers' aborted records are never seen, and a transaction
marker is simply not a record (the committed offset after a transaction is the marker's, and the consumer
moves past it). Partitions are assigned by range, so partition p of every input topic (which all have the
same partition count) goes to the same worker: the tables of a stage partition live with the partitions
that feed them.

The consumer paces its fetches: a broker that answers an empty fetch at once (the embedded noida-db does,
where Kafka waits fetch.wait.max.ms) would otherwise make librdkafka fetch in a tight loop, idle or busy
(modpipe/services/fetching.py). After a fetch that brought records the partitions pause for
MODPIPE_FETCH_PAUSE_MS (not after a backlog's worth, BACKLOG_RECORDS); after one that brought nothing, for a
backoff that grows while the partitions stay idle, up to MODPIPE_FETCH_IDLE_PAUSE_MS. A broker that holds an
empty fetch until data comes (Apache Kafka) needs neither pause: with both at 0 the partitions are never
paused for pacing, and librdkafka's held fetches bring each record as it arrives. While the wiring has more queued than it can take, the
partitions are paused too (back-pressure), and polling goes on, so rebalances are still served.

A join the group never answers is left: librdkafka waits on a JoinGroup request for max.poll.interval.ms
(15 min here, so that a restore can run inside the assignment callback), and the embedded broker has been
seen leaving two members that joined together without an answer (docs/faults.md). A consumer that has had
no assignment for `rejoin_after_s` since it subscribed or gave its partitions up is closed and replaced by a
new one (MODPIPE_GROUP_REJOIN_S). It owns no partitions then, so nothing is in flight to commit or fence.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable, Coroutine

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec
from modpipe.streams import metrics
from modpipe.streams.kafka.records import TP, Record, records_bytes
from modpipe.streams.kafka.stalls import FetchWatch

from modpipe import log
from modpipe.services.fetching import (
    BACKLOG_RECORDS,
    FETCH_WAIT_S,
    PACED_CONSUMER_CONFIG,
    START_GRACE_S,
    fetch_window,
    resume_now,
)

_log = log.get(__name__)

EMPTY_BACKOFF_S = 0.002
EMPTY_BACKOFF_MAX_S = 0.025  # MODPIPE_FETCH_IDLE_PAUSE_MS's default
IDLE_FETCH_WAIT_MAX_S = 0.2  # the longest fetch window of an idle consumer on long-polled fetches (idle_fetch_wait)
# A rebalance callback may commit a checkpoint (a revocation); past this the consumer fails and the worker restarts.
# Tables are restored off the callback (streams/runtime/runner.py), their partitions held back meanwhile.
REBALANCE_CALLBACK_TIMEOUT_S = 660.0
# After an assignment the consumer does not pause for this long: librdkafka first looks up each partition's
# committed offset and starts its fetcher, and a partition paused before it started is not woken by a seek.
ASSIGNMENT_GRACE_S = START_GRACE_S
LAG_EVERY_S = 5.0  # how often modpipe_consumer_lag_messages is brought up to date
UNASSIGNED_WARN_S = 30.0  # with rejoining off, a consumer without an assignment says so this often
CLOSE_TIMEOUT_S = 10.0  # a consumer left for a new one is closed on a thread of its own, waited on this long
# Leaving the group at shutdown waits at most this long: librdkafka's close waits for the group's answers (a
# JoinGroup the broker holds up to max.poll.interval.ms while another member commits its revocation) and has been seen to block
# for good. The group drops a member that stops anyway after its session timeout (10 s, streams/moderation/app.py),
# so waiting longer than that gains nothing.
LEAVE_TIMEOUT_S = 10.0
STALL_CHECK_EVERY_S = 5.0  # how often the quiet partitions' ends are asked for (MODPIPE_FETCH_STALL_S > 0)
END_TIMEOUT_S = 0.5  # a committed offset asked for at most this long (a quiet partition that delivered nothing)
# The quiet partitions' ends are asked in one request without waiting (`_ask_ends`): one after another on the poll
# thread they held a worker's fetching for up to ~1.5 s every 15 s once its quiet partitions were due (reports,
# labels, stage topics: ~36 of its ~40), and a post that came meanwhile waited as long.
ENDS_TIMEOUT_S = 5.0
# Committed offsets at an assignment: each ask waits up to COMMITTED_ASK_S (librdkafka asks again meanwhile while
# the broker answers UNSTABLE_OFFSET_COMMIT); failures are asked again after COMMITTED_RETRY_S for up to
# COMMITTED_WAIT_S, twice a transaction.timeout.ms of 120 s (MODPIPE_TRANSACTION_TIMEOUT_MS: 30 s by default), which
# ends any transaction holding them; within max.poll.interval.ms (900 s, streams/moderation/app.py).
COMMITTED_ASK_S = 10.0
COMMITTED_RETRY_S = 1.0
COMMITTED_WAIT_S = 240.0
ADMIN_CONFIG = ("bootstrap.servers", "security.", "sasl.", "ssl.", "client.id", "logger", "socket.",
                "broker.address.family")  # what the ends' admin client takes of the consumer's settings
# what a stalled partition's log line tells of librdkafka's view of it (its statistics, when they are on)
PARTITION_STATS = ("fetch_state", "fetchq_cnt", "next_offset", "app_offset", "committed_offset", "ls_offset",
                   "hi_offset", "leader", "consumer_lag", "desired", "unknown")


class CommittedOffsetsUnknown(RuntimeError):
    """The group's committed offsets could not be read at an assignment."""


def empty_backoff(empty_in_a_row: int, cap_s: float = EMPTY_BACKOFF_MAX_S) -> float:
    """Seconds to pause after the n-th consume in a row that brought nothing: doubling from EMPTY_BACKOFF_S up to
    `cap_s` (0: never)."""
    if empty_in_a_row <= 0 or cap_s <= 0:
        return 0.0
    return min(EMPTY_BACKOFF_S * 2 ** min(empty_in_a_row - 1, 30), cap_s)


def idle_fetch_wait(empty_in_a_row: int, cap_s: float = IDLE_FETCH_WAIT_MAX_S) -> float:
    """How long a fetch window waits for its first record after `empty_in_a_row` windows that brought none, on
    a broker whose fetches are long-polled (no idle pause: Apache Kafka): FETCH_WAIT_S, doubling up to `cap_s`.
    A record ends the wait at once, whatever its length; what waits is the thread's other work (a seek the
    loop asked for, back-pressure's pause, a stop), at most `cap_s`. An idle worker's thread woke 100 times a
    second, about half of an idle worker's CPU (docs/benchmarks.md)."""
    if empty_in_a_row <= 0:
        return FETCH_WAIT_S
    return min(FETCH_WAIT_S * 2 ** min(empty_in_a_row, 30), max(cap_s, FETCH_WAIT_S))


class GroupConsumer:
    """`on_assigned(tps)`, `on_revoked(tps)` and `on_lost(tps)` are coroutines run on the loop; the group waits
    for them (a revocation's commit). `on_assigned` returns the partitions to hold back (their tables are still
    being restored): they are assigned paused and fetch nothing until `release(tps)`."""

    def __init__(self, conf: dict, topics: list[str], *,
                 on_assigned: Callable[[list[TP]], Coroutine], on_revoked: Callable[[list[TP]], Coroutine],
                 on_lost: Callable[[list[TP]], Coroutine], batch_size: int = 500, fetch_pause_s: float = 0.0,
                 idle_pause_max_s: float = EMPTY_BACKOFF_MAX_S, rejoin_after_s: float = 20.0,
                 stall_s: float = 0.0):
        self.conf = {**conf, "enable.auto.commit": False, "enable.auto.offset.store": False,
                     "isolation.level": "read_committed", "partition.assignment.strategy": "range",
                     "auto.offset.reset": "earliest", **PACED_CONSUMER_CONFIG}
        # stall_s > 0: partitions that stop fetching are found and sought (streams/kafka/stalls.py); librdkafka's
        # statistics, kept as they come and read only for a stalled partition's log line, say why
        self.stall_watch = FetchWatch(stall_s) if stall_s > 0 else None
        self._stats: str | None = None
        self._stall_check_due = 0.0
        # the quiet partitions' ends being asked (`_ask_ends`), with the assignment they were asked under: an
        # answer from before a rebalance is dropped; asked through an admin client of its own, made at the first check
        self._ends_asked: tuple[int, dict] | None = None
        self._admin: AdminClient | None = None
        self._watch_generation = 0
        if self.stall_watch is not None:
            self.conf.update({"statistics.interval.ms": int(max(1.0, stall_s / 2) * 1000), "stats_cb": self._keep_stats})
        self.topics = topics
        self.on_assigned, self.on_revoked, self.on_lost = on_assigned, on_revoked, on_lost
        self.batch_size = batch_size
        self.fetch_pause_s = fetch_pause_s  # after a fetch that brought records (MODPIPE_FETCH_PAUSE_MS)
        self.idle_pause_max_s = idle_pause_max_s  # the longest pause after empty fetches (MODPIPE_FETCH_IDLE_PAUSE_MS)
        self.consumer: Consumer | None = None
        self.busy: Callable[[], bool] = lambda: False  # the wiring has more queued than it takes (back-pressure)
        # bytes of the batches handed to the event loop, counted here as they go (this thread writes it, the loop
        # reads it): a loop busy for a while (a checkpoint's flush) has not counted them yet, and `busy` must see
        # them, or this thread hands over everything librdkafka brings meanwhile (~480 MB once, feedback drain)
        self.handed_bytes = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deliver: Callable[[list[Record]], None] | None = None
        self._commands: collections.deque[Callable[[Consumer], None]] = collections.deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: Exception | None = None
        self._group_metadata = None
        self._committed: dict[TP, int] = {}  # at the last assignment (-1001: none)
        self._committed_metadata: dict[TP, str | None] = {}  # and the metadata committed with them
        self.stopping = False  # set when the worker stops: polling ends, no assignment is taken on
        self._next: dict[TP, int] = {}  # per partition, the offset after the last record handed over (poll thread)
        self._sought: set[TP] = set()  # partitions sought by seek() that have delivered no record since (poll thread)
        self._lag_due = 0.0  # when the poll thread next brings modpipe_consumer_lag_messages up to date
        self._assigned_at = 0.0  # monotonic time of the last assignment; 0: none yet
        self.rejoin_after_s = rejoin_after_s  # 0: never rejoin, only warn
        self._unassigned_since: float | None = None  # monotonic; None while the group's answer stands
        self.rejoins = 0  # consumers replaced because the group did not answer
        self.on_failure: Callable[[Exception], None] | None = None  # called on the loop when polling fails
        # rebalance callbacks served so far (poll thread): a fetch window during which one ran is checked
        self._revocations = 0
        self._assignments = 0
        self.dropped_after_revocation = 0  # records a fetch window returned from before a revocation
        self._held: set[TP] = set()  # assigned, paused until released (poll thread)
        self._paused = False  # every partition paused for back-pressure (poll thread)

    def start(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[list[Record]], None]) -> GroupConsumer:
        self._loop, self._deliver = loop, deliver
        self.consumer = self._subscribe()
        self._thread = threading.Thread(target=self._run, name="group-consumer", daemon=True)
        self._thread.start()
        return self

    def _subscribe(self) -> Consumer:
        consumer = Consumer(self.conf)
        consumer.subscribe(self.topics, on_assign=self._assign_cb, on_revoke=self._revoke_cb, on_lost=self._lost_cb)
        self._unassigned_since = time.monotonic()
        return consumer

    def _rejoin(self, old: Consumer, waited_s: float) -> Consumer:
        """Leave a join the group has not answered and join again with a new consumer (poll thread)."""
        self.rejoins += 1
        metrics.GROUP_REJOINS.inc()
        _log.warning("no assignment from the group: joining again with a new consumer",
                     extra={"seconds": round(waited_s), "rejoins": self.rejoins})
        # close() may itself wait on the unanswered request; the new consumer does not wait for it (with
        # static membership the new member takes the instance id over, fencing the old one)
        self.consumer = None  # an answer reaching the old one now (or later) is not acted on
        self._close_within(old, CLOSE_TIMEOUT_S, "group-consumer-close")
        self._commands.clear()  # seeks were for partitions the old consumer no longer has
        self._held = set()
        self.consumer = self._subscribe()
        return self.consumer

    @classmethod
    def _close_within(cls, consumer: Consumer, timeout_s: float, name: str) -> bool:
        """Close `consumer` on a thread of its own, waiting at most `timeout_s`; False if it has not finished."""
        closer = threading.Thread(target=cls._close_quietly, args=(consumer,), name=name, daemon=True)
        closer.start()
        closer.join(timeout_s)
        return not closer.is_alive()

    @staticmethod
    def _close_quietly(consumer: Consumer) -> None:
        try:
            consumer.close()
        except Exception as exc:  # noqa: BLE001 - it is being left anyway
            _log.warning("consumer close failed", extra={"error": str(exc)})

    def alive(self) -> bool:
        return self.failure is None and self._thread is not None and (self._thread.is_alive() or self._stop.is_set())

    def group_metadata(self):
        """The group generation and member id that a transaction's offsets carry (KIP-447); read on the poll
        thread at each assignment."""
        return self._group_metadata

    def seek(self, tp: TP, offset: int) -> None:
        """Read `tp` again from `offset` (on the poll thread, before its next fetch)."""
        def run(c: Consumer) -> None:
            c.seek(TopicPartition(tp.topic, tp.partition, offset))
            self._next[tp] = offset
            self._sought.add(tp)
            if self.stall_watch is not None:
                self.stall_watch.sought(tp, offset, time.monotonic())
        self._commands.append(run)

    def release(self, tps: list[TP]) -> None:
        """Partitions held back at their assignment fetch from now on (on the poll thread). Called while that
        assignment stands (its revocation waits for the restore that calls this): a release that reaches the poll
        thread after a later assignment held the same partitions again is dropped."""
        assignment = self._assignments

        def run(c: Consumer) -> None:
            if assignment != self._assignments:
                return
            released = [tp for tp in tps if tp in self._held]
            self._held.difference_update(tps)
            if self.stall_watch is not None:
                self.stall_watch.added(released, self._committed, time.monotonic())
            if not self._paused:
                self._resume(c, [TopicPartition(tp.topic, tp.partition) for tp in released])
        self._commands.append(run)

    def _resume(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        # at once, not at librdkafka's next wake-up; seeks only where needed (modpipe/services/fetching.py)
        if self._held:
            tps = [tp for tp in tps if TP(tp.topic, tp.partition) not in self._held]
        resume_now(consumer, tps, self._next, self._sought)

    def _report_lag(self, consumer: Consumer) -> None:
        """Records behind each assigned partition's end (on the poll thread: a call into the consumer from
        the event loop's thread can block the loop while librdkafka serves the poll thread). From the
        consumer's position (past a transaction's commit marker, unlike the last record's offset + 1), or
        where nothing was read since the assignment, from the committed offset (the log start where none)."""
        for tp in consumer.position(consumer.assignment()):
            low, high = consumer.get_watermark_offsets(tp, cached=True)
            if high < 0:
                continue
            at = tp.offset if tp.offset >= 0 else self._committed.get(TP(tp.topic, tp.partition), -1)
            if at < 0:
                at = max(low, 0)
            metrics.CONSUMER_LAG.labels(tp.topic, str(tp.partition)).set(max(0, high - at))

    def _call_on_loop(self, coro_fn, partitions):
        tps = [TP(p.topic, p.partition) for p in partitions]
        future = asyncio.run_coroutine_threadsafe(coro_fn(tps), self._loop)
        return future.result(REBALANCE_CALLBACK_TIMEOUT_S)

    def _assign_cb(self, consumer, partitions) -> None:
        # A resume seeks only partitions that delivered a record (or were sought) since this assignment: a
        # committed offset below the log start would be reset forward by librdkafka and sought back at every
        # resume. Until then the fetchers start on their own, in the grace period (ASSIGNMENT_GRACE_S).
        if consumer is not self.consumer:  # a consumer left by _rejoin
            return
        self._assigned_at = time.monotonic()
        self._unassigned_since = None
        self._lag_due = 0.0  # the new partitions' lag series at once (the dashboard's panel after a restart)
        self._next.clear()
        self._sought.clear()
        self._assignments += 1
        if self.stopping:
            self._committed, self._committed_metadata = {}, {}
            return  # the worker is stopping: it takes no partitions on (librdkafka may still rejoin)
        self._committed = self._committed_offsets(consumer, partitions)  # raises when they cannot be read
        self._group_metadata = consumer.consumer_group_metadata()
        held = set(self._call_on_loop(self.on_assigned, partitions) or ())
        if held:  # assigned paused, before any fetch: their tables are restored meanwhile, off this callback
            consumer.assign(partitions)
            consumer.pause([TopicPartition(tp.topic, tp.partition) for tp in held])
        self._held = held
        if self.stall_watch is not None:  # held partitions are watched once released
            self._watch_generation += 1
            self.stall_watch.assigned([TP(p.topic, p.partition) for p in partitions
                                       if TP(p.topic, p.partition) not in held], self._committed, time.monotonic())

    def _committed_offsets(self, consumer, partitions) -> dict[TP, int]:
        """The group's committed offsets at an assignment, with their metadata (`committed_at_assignment`: the
        changelog ends a restore reads to, streams/state/ends.py). Asked stable: under read_committed, Apache Kafka
        answers UNSTABLE_OFFSET_COMMIT while a transaction that sent offsets for a partition is open (a killed
        worker's, until its restart fences it or transaction.timeout.ms aborts it), and librdkafka asks again
        until its timeout. Offsets that cannot be read are never guessed: the assignment waits, says so at
        error level each time, and asks again, up to COMMITTED_WAIT_S; then the callback raises and the worker
        restarts (a restore to no known end, or a partition sought to a made-up start, would lose or replay)."""
        started = time.monotonic()
        tries = 0
        while True:
            tries += 1
            error = None
            try:
                answer = consumer.committed(partitions, timeout=COMMITTED_ASK_S)
                errors = [tp for tp in answer if getattr(tp, "error", None) is not None]
                if errors:
                    error = f"{errors[0].topic}[{errors[0].partition}]: {errors[0].error}"
            except KafkaException as exc:
                error = str(exc)
            if error is None:
                self._committed_metadata = {TP(tp.topic, tp.partition): getattr(tp, "metadata", None)
                                            for tp in answer}
                return {TP(tp.topic, tp.partition): tp.offset for tp in answer}
            waited = time.monotonic() - started
            if waited + COMMITTED_ASK_S > COMMITTED_WAIT_S or self.stopping or self._stop.is_set():
                _log.error("committed offsets still cannot be read: the assignment fails and the worker restarts",
                           extra={"error": error[:300], "tries": tries, "seconds": round(waited, 1)})
                raise CommittedOffsetsUnknown(f"committed offsets not read within {waited:.0f} s: {error[:300]}")
            _log.error("committed offsets cannot be read: the assignment waits and asks again (nothing is read "
                       "or restored before they are known)",
                       extra={"error": error[:300], "tries": tries, "seconds": round(waited, 1)})
            self._stop.wait(COMMITTED_RETRY_S)

    def committed_at_assignment(self) -> dict[TP, tuple[int, str | None]]:
        """Each assigned partition's committed offset (-1001: none) and its metadata, as read (stable) at the
        last assignment."""
        return {tp: (offset, self._committed_metadata.get(tp)) for tp, offset in self._committed.items()}

    def _revoke_cb(self, consumer, partitions) -> None:
        if consumer is not self.consumer:  # a consumer left by _rejoin
            return
        self._revocations += 1
        self._call_on_loop(self.on_revoked, partitions)
        self._held = set()
        self._unassigned_since = time.monotonic()
        if self.stall_watch is not None:
            self._watch_generation += 1
            self.stall_watch.revoked()

    def _lost_cb(self, consumer, partitions) -> None:
        if consumer is not self.consumer:  # a consumer left by _rejoin
            return
        self._revocations += 1
        self._call_on_loop(self.on_lost, partitions)
        self._held = set()
        self._unassigned_since = time.monotonic()
        if self.stall_watch is not None:
            self._watch_generation += 1
            self.stall_watch.revoked()

    def _waiting_too_long(self, now: float) -> float | None:
        """Seconds the group has left this consumer without an assignment, once that calls for action:
        past `rejoin_after_s` (or UNASSIGNED_WARN_S with rejoining off); None otherwise."""
        since = self._unassigned_since
        if since is None or self.stopping:
            return None
        return now - since if now - since >= (self.rejoin_after_s or UNASSIGNED_WARN_S) else None

    def _run(self) -> None:
        consumer = self.consumer
        empty = 0
        paused = False
        try:
            while not self._stop.is_set():
                while self._commands:
                    self._commands.popleft()(consumer)
                waited = self._waiting_too_long(time.monotonic())
                if waited is not None:
                    if self.rejoin_after_s:
                        consumer = self._rejoin(consumer, waited)
                        empty, paused = 0, False
                        self._paused = False
                    else:  # joining should take seconds
                        _log.warning("no assignment from the group yet", extra={"seconds": round(waited)})
                        self._unassigned_since = time.monotonic()
                if time.monotonic() >= self._lag_due:
                    self._lag_due = time.monotonic() + LAG_EVERY_S
                    self._report_lag(consumer)
                busy = self.busy()
                if self.stall_watch is not None:
                    self._watch_stalls(consumer, paused or busy)
                if busy != paused:  # back-pressure on or off
                    assignment = consumer.assignment()
                    if busy:
                        consumer.pause(assignment)
                    else:
                        self._resume(consumer, assignment)
                    paused = self._paused = busy
                # a short wait lets the fetcher bring what the partitions have (they were just resumed); the
                # window ends once each partition has answered
                revocations, assignments = self._revocations, self._assignments
                idle_wait = idle_fetch_wait(empty) if self.idle_pause_max_s <= 0 else FETCH_WAIT_S
                if paused:
                    messages = fetch_window(consumer, self.batch_size, 0.05)
                elif idle_wait > FETCH_WAIT_S:
                    # idle on long-polled fetches: one longer wait for the first record, then what is queued
                    messages = fetch_window(consumer, self.batch_size, idle_wait)
                else:
                    assignment = consumer.assignment()
                    messages = fetch_window(consumer, self.batch_size, FETCH_WAIT_S,
                                            expect=[(tp.topic, tp.partition) for tp in assignment
                                                    if TP(tp.topic, tp.partition) not in self._held])
                if self._revocations != revocations:
                    messages = self._without_revoked(consumer, messages, self._assignments != assignments)
                records = []
                for m in messages:
                    err = m.error()
                    if err is not None:
                        if err.fatal():
                            raise KafkaException(err)
                        if err.code() != KafkaError._PARTITION_EOF:
                            _log.warning("consumer error", extra={"error": str(err)})
                        else:
                            if self._sought:  # the seek has taken effect and found nothing (a marker) to deliver
                                self._sought.discard(TP(m.topic(), m.partition()))
                            if self.stall_watch is not None:  # at its end: the offset the fetch reached
                                self.stall_watch.moved(TP(m.topic(), m.partition()), m.offset(), time.monotonic())
                        continue
                    ts_type, ts = m.timestamp()
                    tp = TP(m.topic(), m.partition())
                    self._next[tp] = m.offset() + 1
                    if self.stall_watch is not None:
                        self.stall_watch.moved(tp, m.offset() + 1, time.monotonic())
                    if self._sought:
                        self._sought.discard(tp)  # the seek has taken effect: its first record is here
                    records.append(Record(m.topic(), m.partition(), m.offset(), m.key(), m.value(),
                                          ts if ts_type and ts > 0 else None))
                if records:
                    empty = 0
                    self.handed_bytes += records_bytes(records)
                    self._loop.call_soon_threadsafe(self._deliver, records)
                if paused or time.monotonic() - self._assigned_at < ASSIGNMENT_GRACE_S:
                    continue
                if not records:
                    empty += 1
                if len(records) >= BACKLOG_RECORDS:
                    continue  # a backlog: fetch on at once
                wait = self.fetch_pause_s if records else empty_backoff(empty, self.idle_pause_max_s)
                if wait <= 0:
                    continue
                assignment = consumer.assignment()
                consumer.pause(assignment)
                self._stop.wait(wait)
                self._resume(consumer, assignment)
        except Exception as exc:  # noqa: BLE001 - the worker stops: its restart rejoins the group
            self.failure = exc
            if not self._stop.is_set():
                _log.exception("group consumer failed")
                if self.on_failure is not None:
                    self._loop.call_soon_threadsafe(self.on_failure, exc)

    def _without_revoked(self, consumer: Consumer, messages: list, reassigned: bool) -> list:
        """The fetch window's messages when a revocation ran inside it (librdkafka serves rebalance callbacks
        within `consume`): the records it returned may have been fetched for the old assignment, which the
        wiring has committed and dropped by now. Handed over, they started rounds on partitions the worker no
        longer owned, whose offsets then failed the next checkpoint with ILLEGAL_GENERATION once the group had
        moved on (the worker stopped; seen in tests/integration/test_zombie.py), and a partition assigned again
        would read them twice. All its records are dropped (errors other than end-of-partition are kept); a
        partition assigned within the same window is sought back to where its new assignment starts, so what
        its fetcher had brought is read again, once (poll thread)."""
        kept, records, dropped = [], 0, set()
        for m in messages:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    kept.append(m)
                continue
            records += 1
            dropped.add(TP(m.topic(), m.partition()))
        if not dropped:
            return kept
        self.dropped_after_revocation += records
        _log.warning("records fetched before a revocation dropped (their partitions' owner reads them)",
                     extra={"records": records, "partitions": len(dropped), "reassigned": reassigned})
        if reassigned:
            now = {TP(tp.topic, tp.partition) for tp in consumer.assignment()}
            for tp in dropped & now:
                if tp not in self._committed:  # the assignment read them all or failed: never guessed
                    raise CommittedOffsetsUnknown(f"{tp.topic}[{tp.partition}] assigned without its committed offset")
                start = self._committed[tp]
                # -1001: the group has never committed an offset for it, so its new assignment reads it from the
                # log start (auto.offset.reset=earliest): no record of it was ever processed
                offset = start if start >= 0 else OFFSET_BEGINNING
                # a seek that fails raises: the worker stops and its restart reads from the committed offsets
                consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
                self._next[tp] = offset
                self._sought.add(tp)
                if self.stall_watch is not None:
                    self.stall_watch.sought(tp, offset, time.monotonic())
        return kept

    # -- partitions that stop fetching (poll thread)
    def _keep_stats(self, raw: str) -> None:
        self._stats = raw

    def _partition_stats(self, tp: TP) -> dict:
        try:
            p = orjson.loads(self._stats or "{}")["topics"][tp.topic]["partitions"][str(tp.partition)]
        except (KeyError, TypeError, orjson.JSONDecodeError):
            return {}
        return {k: p.get(k) for k in PARTITION_STATS}

    def _watch_stalls(self, consumer: Consumer, held: bool) -> None:
        """Every STALL_CHECK_EVERY_S: the quiet partitions' ends asked for without waiting (`_ask_ends`), and once
        they are answered, a seek for each partition stalled (a failure for one that stalls again). Partitions
        this consumer holds back itself (`held`: back-pressure) or that were just assigned are not judged."""
        watch, now = self.stall_watch, time.monotonic()
        if self._admin is not None:
            self._admin.poll(0)  # its log lines (the `logger` it shares with the consumer), without waiting
        if held or now - self._assigned_at < ASSIGNMENT_GRACE_S:
            watch.hold(now)
            return
        if self._ends_asked is not None:
            generation, futures = self._ends_asked
            if not all(f.done() for f in futures.values()):
                return
            self._ends_asked = None
            if generation != self._watch_generation:
                return  # asked before a rebalance: the partitions and their positions have changed since
            self._judge(consumer, futures)
            return
        if now < self._stall_check_due:
            return
        self._stall_check_due = now + STALL_CHECK_EVERY_S
        quiet = watch.quiet(now)
        if quiet:
            self._ends_asked = (self._watch_generation, self._ask_ends(quiet))

    def _ask_ends(self, quiet: list[TP]) -> dict:
        """Futures of each quiet partition's last stable offset (("end", tp)) and, for one that has delivered
        nothing yet, of its log start (("start", tp)): one request a broker, answered on librdkafka's threads.
        The poll thread never waits for them: asked one after another with `get_watermark_offsets` (a round trip
        each, up to END_TIMEOUT_S) they held every partition's fetching for up to ~1.5 s."""
        if self._admin is None:
            self._admin = AdminClient({k: v for k, v in self.conf.items() if k.startswith(ADMIN_CONFIG)})
        specs = {TopicPartition(tp.topic, tp.partition): OffsetSpec.latest() for tp in quiet}
        starts = {TopicPartition(tp.topic, tp.partition): OffsetSpec.earliest() for tp in quiet
                  if tp not in self.stall_watch.reached}
        futures = {}
        for kind, asked in (("end", specs), ("start", starts)):
            if not asked:
                continue
            try:
                answers = self._admin.list_offsets(asked, isolation_level=IsolationLevel.READ_COMMITTED,
                                                   request_timeout=ENDS_TIMEOUT_S)
            except KafkaException:
                continue  # asked again at the next check
            futures.update({(kind, TP(ctp.topic, ctp.partition)): f for ctp, f in answers.items()})
        return futures

    def _judge(self, consumer: Consumer, futures: dict) -> None:
        """The ends are in: where a partition that has delivered nothing starts (its committed offset, else its log
        start), then a seek for each stalled one. A partition not answered is asked again at a later check."""
        watch = self.stall_watch
        answered = {}
        for key, f in futures.items():
            try:
                answered[key] = f.result().offset
            except Exception:  # noqa: BLE001 - a timeout, a leader that moved: the next check asks again
                continue
        ends = {tp: offset for (kind, tp), offset in answered.items() if kind == "end"}
        for tp in [tp for tp in ends if tp not in watch.reached]:
            low = answered.get(("start", tp))
            if low is not None and self._committed.get(tp, 0) < 0:
                watch.start(tp, low)  # nothing committed: the consumer starts at the log's start
                continue
            try:
                (c,) = consumer.committed([TopicPartition(tp.topic, tp.partition)], timeout=END_TIMEOUT_S)
            except KafkaException:
                ends.pop(tp)
                continue
            if c.offset >= 0 or low is not None:
                watch.start(tp, c.offset if c.offset >= 0 else low)
        for tp in watch.stalled(ends, time.monotonic()):
            self._kick(consumer, tp, ends[tp])

    def _kick(self, consumer: Consumer, tp: TP, end: int) -> None:
        watch = self.stall_watch
        at = watch.reached[tp]
        metrics.FETCH_STALLS.labels(tp.topic).inc()
        detail = {"topic": tp.topic, "partition": tp.partition, "delivered_up_to": at, "last_stable_offset": end,
                  "quiet_s": watch.stall_s, "librdkafka": self._partition_stats(tp)}
        if tp in watch.kicked:
            _log.error("partition stalled again after a seek: the worker restarts with a new consumer", extra=detail)
            raise RuntimeError(f"{tp.topic}[{tp.partition}] is not fetched (records from {at} to {end})")
        _log.warning("partition not fetched although it has records: seeking it to where it stopped", extra=detail)
        watch.kicked.add(tp)
        ctp = TopicPartition(tp.topic, tp.partition, at)
        consumer.resume([ctp])
        consumer.seek(ctp)
        self._next[tp] = at
        self._sought.add(tp)
        watch.sought(tp, at, time.monotonic())

    def stop_polling(self) -> None:
        """A failed worker stops reading at once: no rejoin, no assignment taken while it shuts down."""
        self.stopping = True
        self._stop.set()

    def close(self, timeout_s: float = LEAVE_TIMEOUT_S) -> bool:
        """Stop polling and leave the group, waiting at most `timeout_s` for librdkafka (False: it had not
        finished, and goes on on a thread of its own). The revocation callback waits for the loop: never call
        this on the loop's own thread."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self.consumer is None:
            return True
        if not self._close_within(self.consumer, timeout_s, "group-consumer-leave"):
            _log.warning("leaving the group did not finish: stopping without it (the group drops this member "
                         "after its session timeout)", extra={"seconds": timeout_s})
            return False
        return True
