"""The worker's loop: records from the group consumer become rounds for their topic's handler
(streams/moderation/agents.py); the checkpoint commits them (streams/checkpointing/checkpoint.py); rebalances hand partitions over.

A round is what one fetch brought for one topic (at most ROUND_MAX records). Handlers run one round at a
time, synchronously, except the awaiting-text one, which waits for Triton on a task of its own (one round at
a time, so its records are decided in order). Rounds go on while a checkpoint waits for the rounds of its
epoch and commits them; they belong to the next epoch (streams/checkpointing/checkpoint.py).

Hand-over: when the group takes partitions away, the revocation waits here until the rounds in flight are
complete and a checkpoint has committed them; records fetched but not started are dropped (their new owner
reads them from the committed offset), and the tables of the partitions are forgotten. When partitions are
given, the assignment callback only reads their committed offsets and starts the restore: each partition number
whose tables are restored from the changelogs is held back (every input topic's partition of that number,
assigned paused) and released as soon as its tables are in (the numbers are restored side by side), while the
others are worked on; so the group waits for no restore, and a revocation meanwhile calls the restore off. A worker that
loses its partitions without a revocation (its session expired) stops without committing.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import threading
import time

from modpipe.features import events as fe
from modpipe.streams import metrics
from modpipe.streams.checkpointing.checkpoint import Checkpointer, FreezeWatch
from modpipe.streams.kafka.consumer import GroupConsumer
from modpipe.streams.kafka.records import TP, Record, records_bytes
from modpipe.streams.runtime.purge import PurgePlan, Purger
from modpipe.streams.state import ends as changelog_ends
from modpipe.streams.state import tables
from modpipe.streams.waiting import wait_at_most

from modpipe import log, memory
from modpipe.settings import Settings

_log = log.get(__name__)

ROUND_MAX = 128  # records handled per round at most (a stage record is a bundle of many items)
MAX_QUEUED_BATCHES = 8  # fetched batches waiting for their rounds before fetching pauses
AWAITING_TEXT_RETRY_S = 1.0  # the text model is still out: read the awaiting posts again after this
RESTORE_THREADS = 16  # partition numbers restored at once, each on its own thread with its own changelog reader


class Runner:
    def __init__(self, settings: Settings, bootstrap: str, wiring, outbox, handlers: dict, consumer_conf: dict):
        self.settings, self.bootstrap, self.wiring, self.outbox = settings, bootstrap, wiring, outbox
        self.handlers = handlers
        self.awaiting_topic = wiring.topics.awaiting_text
        self.stage_of_topic = {topic: stage for stage, topic in wiring.topics.stages.items()}
        self.consumer = GroupConsumer(consumer_conf, list(handlers), on_assigned=self.on_assigned,
                                      on_revoked=self.on_revoked, on_lost=self.on_lost,
                                      fetch_pause_s=settings.fetch_pause_ms / 1000,
                                      idle_pause_max_s=settings.fetch_idle_pause_ms / 1000,
                                      rejoin_after_s=settings.group_rejoin_s, stall_s=settings.fetch_stall_s)
        self.consumer.busy = self._busy
        session_s = float(consumer_conf.get("session.timeout.ms", 10_000)) / 1000
        heartbeat_s = float(consumer_conf.get("heartbeat.interval.ms", 2_000)) / 1000
        self.watch = FreezeWatch(limit_s=max(1.0, session_s - heartbeat_s)) if settings.freeze_guard == "on" else None
        internal = [*wiring.topics.stages.values(), wiring.topics.awaiting_text]
        self.purger = Purger(PurgePlan(internal, settings.purge_interval_ms / 1000),
                             {**settings.kafka_client_config(), "bootstrap.servers": bootstrap})
        self.checkpoint = Checkpointer(self, wiring, outbox, self.consumer, settings.commit_interval_ms / 1000,
                                       self.watch, purger=self.purger,
                                       model_wait_s=settings.checkpoint_model_wait_ms / 1000)
        wiring.on_round = self.checkpoint.processed  # a carried post's decision is a round of its own
        # each stage's tables, and the stage each table's changelog end is committed with: the post stage's
        # partitions also hold the posts carried across checkpoints (streams/moderation/carried.py)
        self.tables_of_stage = {stage: [wiring.pipe.tables[t] for t in tables] for stage, tables in fe.STAGES.items()}
        self.tables_of_stage[fe.STAGE_OF[fe.POST]].append(wiring.pipe.awaiting_model)
        self.stage_of_table = {t.name: stage for stage, tables in self.tables_of_stage.items() for t in tables}
        self._batches: collections.deque[list[Record]] = collections.deque()
        # fetched records waiting for their rounds, in bytes: fetching pauses past the share (modpipe/memory.py)
        self._batch_bytes: collections.deque[int] = collections.deque()
        self.fetched_bytes = 0
        self._fetched_bytes = metrics.BUFFER_BYTES.labels("fetched")  # looked up once: set every batch
        self.received_bytes = 0  # every batch's bytes as it arrived (written on the loop only)
        self.fetched_max_bytes = memory.budget_bytes("fetched", settings.worker_memory_mb)
        self._wake = asyncio.Event()
        self._rounds_open = asyncio.Event()
        self._rounds_open.set()
        self._awaiting: collections.deque[list[Record]] = collections.deque()
        self._awaiting_wake = asyncio.Event()
        # next offset per input partition, of the rounds started in each checkpoint epoch not yet committed
        self._offsets: dict[int, dict[TP, int]] = {}
        self._rewound: dict[TP, int] = {}  # partition sought back to this offset: later records are stale
        self._tasks: list[asyncio.Task] = []
        self._generation = 0  # one more at each revocation
        self._owned: set[TP] = set()  # input partitions assigned and restored (modpipe_assigned_partitions)
        self._last_committed: dict[TP, int] = {}  # per owned partition, its offset as last committed (-1001: none)
        self.committing_on_revoke = True  # False once the worker stops without committing (a crash)
        self._restoring: asyncio.Task | None = None  # the assignment's restore (`_restore`), until it is done
        self._restore_off = threading.Event()  # calls that restore off (read on the restore's thread)

    # -- the consumer's side
    def start(self) -> Runner:
        loop = asyncio.get_running_loop()
        if self.watch is not None:
            self.watch.start()
        self.consumer.start(loop, self._deliver)
        self._tasks = [loop.create_task(self._run(), name="rounds"),
                       loop.create_task(self._run_awaiting(), name="awaiting-text"),
                       loop.create_task(self.checkpoint.run_forever(), name="checkpoints"),
                       loop.create_task(self.checkpoint.expire_forever(), name="expiry")]
        for task in self._tasks:
            task.add_done_callback(self._task_done)
        return self

    def _task_done(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:
            _log.error("worker task failed", extra={"task": task.get_name(), "error": repr(task.exception())})
            self.wiring.crash(task.exception())

    def _deliver(self, records: list[Record]) -> None:
        size = records_bytes(records)
        self.received_bytes += size  # what the consumer's thread counted as it handed them over (`_busy`)
        self._batches.append(records)
        self._batch_bytes.append(size)
        self.fetched_bytes += size
        self._fetched_bytes.set(self.fetched_bytes)
        self._wake.set()

    def _next_batch(self) -> list[Record]:
        self.fetched_bytes -= self._batch_bytes.popleft()
        self._fetched_bytes.set(self.fetched_bytes)
        return self._batches.popleft()

    def _busy(self) -> bool:  # read on the consumer's thread
        in_transit = max(0, getattr(self.consumer, "handed_bytes", 0) - self.received_bytes)  # handed, not received
        return len(self._batches) >= MAX_QUEUED_BATCHES or self.fetched_bytes + in_transit > self.fetched_max_bytes or \
            self.wiring.batcher.full

    # -- rounds
    def pause_rounds(self) -> None:
        self._rounds_open.clear()

    def resume_rounds(self) -> None:
        self._rounds_open.set()

    def take_offsets(self, epoch: int) -> dict[TP, int]:
        """The input offsets the checkpoint of `epoch` commits: those of its rounds, plus, unchanged, those of
        each stage partition whose tables' changelogs it wrote without a round of that stage partition (items
        applied without the Kafka hop, expiry's tombstones), so that their ends go with them
        (`offset_metadata`) and the transaction is fenced by the group generation like any other. A transaction
        with neither commits every owned stage partition's offset: none commits without offsets."""
        offsets = self._offsets.pop(epoch, {})
        stage_topics = self.wiring.topics.stages
        for table, partition in self.wiring.changelog_ends.written():
            tp = TP(stage_topics[self.stage_of_table[table]], partition)
            if tp not in offsets:
                offsets[tp] = self._committed_offset(tp)
        if not offsets:
            offsets = {tp: self._committed_offset(tp) for tp in self._owned if tp.topic in self.stage_of_topic}
        return offsets

    def _committed_offset(self, tp: TP) -> int:
        # nothing committed yet: 0, which a consumer starts from as it would without a commit (at the log start,
        # or at the earliest record left when 0 is below it: auto.offset.reset=earliest)
        return max(self._last_committed.get(tp, 0), 0)

    def offset_metadata(self, offsets: dict[TP, int]) -> dict[TP, str]:
        """The metadata each stage partition's offset is committed with: the changelog ends of its stage's tables
        at its partition number, as this checkpoint leaves them (streams/state/ends.py)."""
        out = {}
        for tp in offsets:
            stage = self.stage_of_topic.get(tp.topic)
            if stage is not None:
                out[tp] = changelog_ends.encode(self.wiring.changelog_ends.of(
                    [t.name for t in self.tables_of_stage[stage]], tp.partition))
        return out

    def offsets_committed(self, offsets: dict[TP, int]) -> None:
        """A checkpoint committed `offsets` (the next one that commits a partition without a round of it
        commits the same offset again)."""
        self._last_committed.update(offsets)

    def _done(self, records: list[Record], epoch: int) -> None:
        offsets = self._offsets.setdefault(epoch, {})
        for r in records:  # in offset order per partition: the last one wins
            offsets[r.tp] = r.offset + 1

    def _fresh(self, records: list[Record]) -> list[Record]:
        """Without the records fetched before a partition was sought back (they come again)."""
        if not self._rewound:
            return records
        out = []
        for r in records:
            to = self._rewound.get(r.tp)
            if to is not None:
                if r.offset != to:
                    continue
                del self._rewound[r.tp]
            out.append(r)
        return out

    async def _run(self) -> None:
        while True:
            if not self._batches:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._rounds_open.wait()
            if self.wiring.batcher.full:
                # fetched records already past the pause would add their posts on top: they wait for room
                await self.wiring.batcher.room()
                continue
            if self.wiring.checkpoint_full:
                # the next checkpoint lets the states and the held-back records go: rounds wait for it, not memory
                self.checkpoint.processed()
                await self.wiring.checkpoint_room()
                continue
            if not self._batches:
                continue
            by_topic: dict[str, list[Record]] = {}
            for r in self._fresh(self._next_batch()):
                by_topic.setdefault(r.topic, []).append(r)
            generation = self._generation
            for topic, records in by_topic.items():
                if topic == self.awaiting_topic:
                    self._awaiting.append(records)
                    self._awaiting_wake.set()
                    continue
                handler = self.handlers[topic]
                for i in range(0, len(records), ROUND_MAX):
                    if i and self.wiring.batcher.full:  # a fetched batch of posts is many rounds: one at a time
                        await self.wiring.batcher.room()
                        await self._rounds_open.wait()
                        if self._generation != generation:
                            break  # revoked meanwhile: the rest is read again by the partitions' next owner
                    if i and self.wiring.checkpoint_full:  # a batch of bundles can touch tens of thousands of keys
                        self.checkpoint.processed()
                        while self.wiring.checkpoint_full and self._generation == generation:
                            await self.wiring.checkpoint_room()
                        await self._rounds_open.wait()
                        if self._generation != generation:
                            break  # revoked meanwhile: the rest is read again by the partitions' next owner
                    chunk = records[i:i + ROUND_MAX]
                    handler(chunk)
                    self._done(chunk, self.wiring.open_epoch)  # the round's: nothing awaited since it started
                    # due before the next chunk waits for room: a revocation meanwhile must commit (carry) this
                    # round, not find nothing to commit and then drop its posts from the decision queue
                    self.checkpoint.processed()
                if self._generation != generation:
                    break
            await asyncio.sleep(0)  # let decisions and delivery reports in between fetched batches

    async def _run_awaiting(self) -> None:
        handler = self.handlers[self.awaiting_topic]
        while True:
            if not self._awaiting:
                self._awaiting_wake.clear()
                await self._awaiting_wake.wait()
                continue
            await self._rounds_open.wait()
            generation = self._generation
            records = self._fresh(self._awaiting.popleft())
            for i in range(0, len(records), ROUND_MAX):
                await self._rounds_open.wait()
                if self._generation != generation:
                    break  # revoked meanwhile: the rest is read again by the partitions' next owner
                chunk = records[i:i + ROUND_MAX]
                # the handler asks Triton first, then opens its round and reports the chunk done as it publishes
                # the decisions, before it yields to the loop again: the chunk's offsets go into the epoch open
                # then, with those decisions, and no checkpoint waits for Triton meanwhile.
                if await handler(chunk, lambda chunk=chunk: self._awaiting_done(chunk),
                                 lambda generation=generation: self._generation == generation):
                    continue
                if self._generation == generation:
                    self._read_again(records[i:])
                await asyncio.sleep(AWAITING_TEXT_RETRY_S)
                break

    def _awaiting_done(self, records: list[Record]) -> None:
        self._done(records, self.wiring.open_epoch)
        self.checkpoint.processed()

    def _read_again(self, records: list[Record]) -> None:
        """Seek each partition back to the first of `records` or of the batches queued behind them; what was
        fetched after that is dropped."""
        first: dict[TP, int] = {}
        for batch in (records, *self._awaiting):
            for r in batch:
                first.setdefault(r.tp, r.offset)
        for tp, offset in first.items():
            self._rewound[tp] = offset
            self.consumer.seek(tp, offset)
        self._awaiting.clear()

    # -- rebalances (run on the loop; the consumer's thread waits for them)
    async def on_revoked(self, tps: list[TP]) -> None:
        _log.info("partitions revoked", extra={"partitions": len(tps)})
        await self._call_restore_off()
        self._own(removed=tps)  # at once: the next assignment may restore for a while before it counts
        self._generation += 1  # the awaiting-text task drops what it holds of the old assignment
        self._batches.clear()  # fetched, not started: their next owner reads them again
        self._batch_bytes.clear()
        self.fetched_bytes = 0
        self._awaiting.clear()
        if self.committing_on_revoke:
            await self.checkpoint.commit_all()
        gone = {tp.partition for tp in tps if tp.topic in self.stage_of_topic}
        dropped = self.wiring.revoked(gone)  # their carried posts are the next owner's to decide
        if dropped:
            _log.info("posts waiting for the text model handed over with their partitions", extra={"posts": dropped})
        for table in [*self.wiring.pipe.tables.values(), self.wiring.pipe.awaiting_model]:
            for p in gone:
                table.drop(p)
        self.wiring.changelog_ends.forget(gone)
        for tp in tps:
            for offsets in self._offsets.values():
                offsets.pop(tp, None)
            self._rewound.pop(tp, None)
            self._last_committed.pop(tp, None)

    async def on_assigned(self, tps: list[TP]) -> list[TP]:
        """Starts the restore of the stage partitions' tables and returns the partitions held back meanwhile:
        every assigned partition whose number is a stage partition's (the consumer assigns them paused)."""
        by_stage: dict[str, list[int]] = {}
        for tp in tps:
            stage = self.stage_of_topic.get(tp.topic)
            if stage is not None:
                by_stage.setdefault(stage, []).append(tp.partition)
        # with range assignment every stage gets the same partition numbers: each number's tables restore together
        numbers = sorted({p for partitions in by_stage.values() for p in partitions})
        if any(sorted(p) != numbers for p in by_stage.values()):
            _log.warning("stage partitions are not co-assigned", extra={"stages": by_stage})
        committed = self.consumer.committed_at_assignment()
        ends = self._committed_ends(by_stage, committed)
        held = [tp for tp in tps if tp.partition in numbers]
        free = [tp for tp in tps if tp.partition not in numbers]
        self._last_committed.update({tp: committed[tp][0] for tp in free if tp in committed})
        self.wiring.assigned(free)
        self._own(added=free)
        _log.info("partitions assigned; restoring tables", extra={"partitions": len(tps), "stage_partitions": numbers,
                                                                 "committed_ends": len(ends), "held": len(held)})
        self._restore_off = threading.Event()
        self._restoring = asyncio.get_running_loop().create_task(
            self._restore(tps, held, by_stage, numbers, ends, committed, self._restore_off),
            name="restore")
        self._restoring.add_done_callback(self._task_done)
        return held

    async def _restore(self, tps: list[TP], held: list[TP], by_stage: dict[str, list[int]], numbers: list[int],
                       ends: dict, committed: dict, off: threading.Event) -> None:
        """Each partition number's tables restored on a thread of its own (one number waiting for a transaction
        held open below its committed end holds back no other), installed on the loop as each is read, and its
        partitions released."""
        started = time.monotonic()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(len(numbers), RESTORE_THREADS)),
                                                     thread_name_prefix="restore")
        try:
            await asyncio.gather(*(self._restore_number(p, pool, held, by_stage, ends, committed, off)
                                   for p in numbers))
        finally:
            pool.shutdown(wait=False)
        if off.is_set():
            return
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        _log.info("partitions assigned", extra={"partitions": len(tps),
                                                "stage_partitions": {s: sorted(p) for s, p in by_stage.items()},
                                                "topic_partitions": {t: sorted(p) for t, p in by_topic.items()},
                                                "restore_seconds": round(time.monotonic() - started, 2)})

    async def _restore_number(self, p: int, pool, held: list[TP], by_stage: dict[str, list[int]], ends: dict,
                              committed: dict, off: threading.Event) -> None:
        tables_of_p = [t for stage, partitions in by_stage.items() if p in partitions
                       for t in self.tables_of_stage[stage]]
        reached: dict[tuple[str, int], int] = {}
        try:
            await asyncio.get_running_loop().run_in_executor(pool, functools.partial(
                tables.restore, tables_of_p, [p], self.settings, self.bootstrap, ends=ends, reached=reached,
                install=False, cancelled=off.is_set))
        except tables.RestoreCancelled:
            return
        if off.is_set():  # called off after the read: nothing installed
            for t in tables_of_p:
                t.restore_abandon(p)
            return
        for t in tables_of_p:
            t.restore_end(p)
        name_of = {t.changelog: t.name for t in tables_of_p}
        for (changelog, partition), end in reached.items():
            self.wiring.changelog_ends.restored(name_of[changelog], partition, end)
        released = [tp for tp in held if tp.partition == p]
        self._last_committed.update({tp: committed[tp][0] for tp in released if tp in committed})
        self.wiring.owned = self.wiring.owned | {tp for tp in released if tp.topic in self.stage_of_topic}
        self.wiring.observe_tables()
        if p in by_stage.get(fe.STAGE_OF[fe.POST], ()):
            self.wiring.decide_restored([p])
        self._own(added=released)
        self.consumer.release(released)

    async def _call_restore_off(self) -> None:
        """A restore still under way stops (its partitions are being taken away) before anything else goes."""
        task, self._restoring = self._restoring, None
        self._restore_off.set()
        if task is not None and not task.done():
            await asyncio.gather(task, return_exceptions=True)

    def _committed_ends(self, by_stage: dict[str, list[int]],
                        committed: dict[TP, tuple[int, str | None]]) -> dict[tuple[str, int], int]:
        """(changelog, partition) -> the end committed with its stage partition's offset. A stage partition whose
        offset was committed without ends (before they were carried) is restored to the last stable offset, as
        then, and said so."""
        ends, without = {}, []
        for stage, partitions in by_stage.items():
            topic = self.wiring.topics.stages[stage]
            for p in partitions:
                offset, metadata = committed.get(TP(topic, p), (-1001, None))
                decoded = changelog_ends.decode(metadata)
                if decoded is None:
                    if offset >= 0:
                        without.append(f"{topic}[{p}]")
                    continue
                for table in self.tables_of_stage[stage]:
                    if table.name in decoded:
                        ends[(table.changelog, p)] = decoded[table.name]
        if without:
            _log.warning("offsets committed without changelog ends: those tables are restored to the last stable "
                         "offset (a checkpoint whose markers are late, or anything above an open transaction, is "
                         "missed)", extra={"partitions": without[:8], "count": len(without)})
        return ends

    async def on_lost(self, tps: list[TP]) -> None:
        await self._call_restore_off()
        self._own(removed=tps)
        self.committing_on_revoke = False
        self.wiring.crash(RuntimeError(f"{len(tps)} partitions lost (the group moved on without this worker)"))

    def _own(self, added=(), removed=()) -> None:
        self._owned = (self._owned | set(added)) - set(removed)
        for topic in self.handlers:
            metrics.ASSIGNED_PARTITIONS.labels(topic).set(sum(tp.topic == topic for tp in self._owned))

    # -- stopping
    async def stop(self, grace_s: float) -> bool:
        """Start no more rounds; wait up to `grace_s` for those in flight, then commit them. Returns whether the
        last checkpoint committed (False: its input is processed again by the partitions' next owner)."""
        await self._cancel_tasks()
        if not await wait_at_most(self.wiring.idle(), grace_s):
            _log.warning("rounds still in flight at shutdown: not committed", extra={"rounds": self.wiring.open_rounds})
            self.committing_on_revoke = False
            return False
        ok = await self.checkpoint.commit_all()
        self.committing_on_revoke = False  # leaving the group revokes: nothing more to commit
        return ok

    async def _cancel_tasks(self) -> None:
        await self._call_restore_off()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        await self._cancel_tasks()
        if self.watch is not None:
            self.watch.stop()
        # leaving the group runs the revocation callback, which waits for this loop: off the loop's thread
        await asyncio.get_running_loop().run_in_executor(None, self.consumer.close)
