"""A checkpoint: the one place where a worker commits. Each is one Kafka transaction holding the outputs of
every round since the previous checkpoint (stage bundles, decisions, dead letters, changelog records) and the
input offsets they came from, so a read_committed reader sees all of them or none, and each input record's
effects exactly once. Quix Streams' `checkpointing/checkpoint.py` orders its commit the same way.

The rounds between two checkpoints form an epoch (streams/checkpointing/outbox.py): a checkpoint commits one epoch, and
the rounds of the next run meanwhile, their records held back by the outbox until the next transaction
opens. So no round waits for a checkpoint, and a decision waits only for the rounds of its own epoch, never
for posts that arrived while its own was at Triton.

The steps, in order:
1. Close the open epoch (`wiring.switch()`): rounds started from now on belong to the next one.
2. Write each table state changed since the last checkpoint once, as a changelog record in the transaction.
   The tables hold exactly the closed epoch's changes at this moment: a round changes them as it starts.
3. Wait until every round of the closed epoch is complete: its records produced and delivered, its posts
   decided, and the changelog records delivered; but for its posts' decisions at most
   MODPIPE_CHECKPOINT_MODEL_WAIT_MS: a post still waiting for the text model then is carried
   (streams/moderation/carried.py), written as state into this transaction, and decided in a later one. So no
   transaction waits on Triton: one is open for the commit interval, this wait and its own requests, well within
   MODPIPE_TRANSACTION_TIMEOUT_MS, however long Triton takes or stays away.
4. With MODPIPE_FREEZE_GUARD=on (the embedded broker), check that this worker may still commit: a process
   that was frozen longer than the group's session (a SIGSTOP, a VM pause) may have lost its partitions
   without having heard of it yet, so it aborts and stops instead. Apache Kafka needs no guard: it refuses
   the offsets of a member of an older group generation (KIP-447), which aborts the transaction, and
   librdkafka drops the partitions of a session it finds expired (tests/integration/test_zombie.py shows
   both with the guard off); the embedded broker checks no generation, so there the guard fences a zombie.
5. Send the closed epoch's input offsets (the next offset after the last record processed, per partition)
   to the transaction with the consumer's group metadata, and commit the transaction; the next one opens.
   Each stage partition's offset carries, as its commit metadata, where its tables' changelogs end with this
   checkpoint (streams/state/ends.py: what the partition's next owner restores to), and a stage partition whose
   tables' changelogs the checkpoint wrote is among the offsets even without a round of its own (its offset
   unchanged): so every transaction commits offsets and is fenced by the group generation.
6. The tables' stores take the committed states (`wiring.committed()`: a RocksDB table writes them to disk
   only now, with their changelog position, streams/state/rocksdb.py), and the next epoch's records held back
   meanwhile go into the next transaction (`outbox.advance()`).
7. The committed offsets of the internal topics go to the purger (streams/runtime/purge.py), which deletes the
   records before them every MODPIPE_PURGE_INTERVAL_MS, on a thread of its own.
A checkpoint that fails stops the worker without committing: the transaction is aborted, and the partitions'
next owner (this worker after its restart) restores the tables from their changelogs, which hold only
committed states, and processes the input again from the committed offsets.

When: as soon as the previous checkpoint is done and the open epoch has a round, if MODPIPE_COMMIT_INTERVAL_MS
passed since the previous epoch closed; before that, as soon as the open epoch's rounds are all complete (a
quiet pipeline commits each post's decision at once; a busy one commits at most once per interval). A quiet
worker also checkpoints when a table holds keys past its retention (streams/state/tables.py): step 2 writes their
tombstones, and the transaction holds their stage partitions' offsets, unchanged, with the new changelog ends. At a revocation and at a stop rounds pause and every epoch
is committed (`commit_all`).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable

from modpipe.streams import metrics
from modpipe.streams.checkpointing.outbox import Pending
from modpipe.streams.waiting import wait_at_most

from modpipe import log

_log = log.get(__name__)

WAITING_REPORT_S = 15.0  # a checkpoint that waits this long for its rounds' deliveries says what it waits for
# Step 5's requests give up by themselves within COMMIT_TIMEOUT_S (streams/checkpointing/outbox.py); one that has
# not returned COMMIT_HUNG_S later never will: librdkafka's send_offsets_to_transaction can wait for ever for a
# group coordinator that was killed (confluentinc/librdkafka#5456, #5511: its own timeout is not checked), holding
# a revocation, and with it the whole group, until some broker happens to change state. Seen in `modpipe chaos`.
COMMIT_TIMEOUT_S = 60.0
COMMIT_HUNG_S = 30.0
EXPIRY_CHECK_S = 1.0  # how often a quiet worker looks for table keys past their retention


class Frozen(RuntimeError):
    """The process was frozen long enough to have lost its group membership."""


class CommitHung(RuntimeError):
    """A transaction request did not return within its own timeout (COMMIT_HUNG_S): the worker stops, and exits even
    though the request's thread is still blocked (streams/worker.py); its restart fences the transaction."""


class Abandoned(RuntimeError):
    """The worker stops after a failure: a checkpoint under way is not committed."""


class FreezeWatch:
    """Notices that the whole process stood still (every thread stopped): a thread that ticks every `tick_s`
    finds a gap longer than `limit_s` between two ticks, or the checkpoint finds the last tick that old."""

    def __init__(self, limit_s: float, tick_s: float = 0.2, clock: Callable[[], float] = time.monotonic):
        self.limit_s, self.tick_s, self.clock = limit_s, tick_s, clock
        self.last_tick = clock()
        self.longest_gap_s = 0.0
        self._stop = threading.Event()

    def tick(self) -> None:
        now = self.clock()
        self.longest_gap_s = max(self.longest_gap_s, now - self.last_tick)
        self.last_tick = now

    def frozen(self) -> bool:
        """Whether a gap past the limit was seen since the watch started (or is under way now)."""
        return max(self.longest_gap_s, self.clock() - self.last_tick) > self.limit_s

    def start(self) -> FreezeWatch:
        def run() -> None:
            while not self._stop.wait(self.tick_s):
                self.tick()
        threading.Thread(target=run, name="freeze-watch", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()


class Epochs:
    """The rounds not complete yet, per epoch. A round belongs to the epoch open when it starts (`opened`
    gives its `Pending`, tagged with the epoch for the outbox); `switch` closes the open epoch for its
    checkpoint, which then waits for `idle(epoch)`."""

    def __init__(self):
        self.open_epoch = 0
        self._open: dict[int, int] = {}  # epoch -> rounds not complete
        self._idle: dict[int, asyncio.Event] = {}  # epoch -> set when its last round completes
        self._live: dict[int, set[Pending]] = {}  # epoch -> its rounds not complete (said when a checkpoint waits)

    @property
    def open_rounds(self) -> int:
        return sum(self._open.values())

    def switch(self) -> int:
        """Close the open epoch and return it; rounds started from now on belong to the next one."""
        closed, self.open_epoch = self.open_epoch, self.open_epoch + 1
        return closed

    def opened(self, on_error: Callable[[Exception], None], epoch: int | None = None, what: str = "round") -> Pending:
        """A round (or a checkpoint's writes) of `epoch` (default: the open one) starts."""
        epoch = self.open_epoch if epoch is None else epoch
        self._open[epoch] = self._open.get(epoch, 0) + 1
        if epoch not in self._idle:
            self._idle[epoch] = asyncio.Event()
        pending = Pending(on_error=on_error, epoch=epoch, what=what)
        pending.on_done = lambda: self._completed(epoch, pending)
        self._live.setdefault(epoch, set()).add(pending)
        return pending

    def _completed(self, epoch: int, pending: Pending) -> None:
        live = self._live.get(epoch)
        if live is None or pending not in live:  # a bug: reported, never counted twice
            _log.error("a round completed twice", extra={"epoch": epoch, "what": pending.what})
            return
        live.discard(pending)
        self._open[epoch] -= 1
        if self._open[epoch] == 0:
            del self._open[epoch]
            del self._live[epoch]
            self._idle.pop(epoch).set()

    def waiting_for(self, epoch: int) -> dict[str, int]:
        """What `epoch`'s rounds not complete yet are, and how many things each kind still waits for."""
        out: dict[str, int] = {}
        for pending in self._live.get(epoch, ()):
            out[pending.what] = out.get(pending.what, 0) + pending.holds
        return out

    async def idle(self, epoch: int | None = None) -> None:
        """Until every round of `epoch` (default: of every epoch) opened so far is complete."""
        while True:
            waiting = [e for e in self._idle if epoch is None or e == epoch]
            if not waiting:
                return
            await self._idle[waiting[0]].wait()


class Checkpointer:
    """Runs the steps above. `runner` knows the offsets processed per epoch (and pauses rounds for
    `commit_all`); `wiring` closes epochs, knows when their rounds are complete and writes the table states;
    `outbox` holds the transaction."""

    def __init__(self, runner, wiring, outbox, consumer, interval_s: float, watch: FreezeWatch,
                 expiry_check_s: float = EXPIRY_CHECK_S, purger=None, model_wait_s: float = 2.0):
        self.runner, self.wiring, self.outbox, self.consumer = runner, wiring, outbox, consumer
        self.purger = purger  # streams/runtime/purge.py: deletes internal-topic records behind the committed offsets
        self.interval_s = interval_s
        self.model_wait_s = model_wait_s  # step 3: how long a checkpoint waits for decisions before carrying posts
        self.expiry_check_s = expiry_check_s
        self.watch = watch
        self._lock = asyncio.Lock()
        self._due = asyncio.Event()
        self.dirty = False  # the open epoch has a round (or table keys to forget)
        # set when the worker stops after a failure: a checkpoint waiting for its rounds gives up (they will
        # not complete), so a revocation's commit_all returns and the consumer can leave the group
        self.abandoned = asyncio.Event()
        self.closed_at = float("-inf")  # loop time the previous epoch closed
        self.commits = 0

    def processed(self) -> None:
        """A round started: a checkpoint is due."""
        if not self.dirty:
            self.dirty = True
            self._due.set()

    async def run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._due.wait()
            self._due.clear()
            if not self.dirty:
                continue
            left = self.closed_at + self.interval_s - loop.time()
            if left > 0:  # early when quiet: nothing in flight means nothing to wait for
                await wait_at_most(self.wiring.idle(self.wiring.open_epoch), left)
            # shielded: a checkpoint that closed its epoch finishes even when this task is cancelled (a stop),
            # so the next epoch's held-back records are never stranded behind it
            await asyncio.shield(self.commit())

    async def expire_forever(self) -> None:
        """On a quiet worker: a checkpoint when a table holds keys past its retention, for their tombstones
        alone. (A task of its own: the same check as a timeout on `run_forever`'s wait, `asyncio.wait_for`,
        halved the feature path's steady rate in `modpipe bench features --posts 3000`.)"""
        while True:
            await asyncio.sleep(self.expiry_check_s)
            if not self.dirty and self.wiring.expiry_due():
                self.processed()

    async def commit(self) -> bool:
        """One checkpoint of the open epoch (nothing when it has no round). On failure the worker stops
        (`wiring.crash`) and this returns False."""
        try:
            await self._commit()
            return True
        except Abandoned:  # the worker is stopping already, and said why
            return False
        except Exception as exc:  # noqa: BLE001 - whatever it was, nothing of this transaction is committed
            _log.error("checkpoint failed; the worker stops without committing", extra={"error": str(exc)[:500]})
            self.wiring.crash(exc)
            return False

    def abandon(self) -> None:
        """The worker stops after a failure: nothing more is committed, and a checkpoint under way stops waiting."""
        self.abandoned.set()

    async def commit_all(self) -> bool:
        """Rounds paused, every epoch committed (at a revocation or a stop). Returns False when one failed."""
        self.runner.pause_rounds()
        try:
            while self.dirty:
                if self.abandoned.is_set():
                    return False
                if not await self.commit():
                    return False
            return await self.commit()  # waits for a checkpoint under way
        finally:
            self.runner.resume_rounds()

    async def _idle(self, epoch: int, timeout: float | None = None) -> bool:
        """Step 3: until every round of `epoch` is complete (False: `timeout` passed first), given up when the
        worker is abandoned meanwhile (its rounds are dropped, never complete)."""
        if self.abandoned.is_set():
            raise Abandoned("the worker stops after a failure: nothing more is committed")
        rounds = asyncio.ensure_future(self.wiring.idle(epoch))
        stop = asyncio.ensure_future(self.abandoned.wait())
        try:
            await asyncio.wait((rounds, stop), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not rounds.done():
                rounds.cancel()
        if stop.done() and not stop.cancelled():
            raise Abandoned("the worker stops after a failure: this checkpoint's rounds will not complete")
        if not rounds.done() or rounds.cancelled():
            return False
        rounds.result()
        return True

    def check_not_frozen(self) -> None:
        """Step 4; the outbox runs it again right before it sends the offsets and before it commits, so a
        freeze that begins after the first check is caught as late as it can be."""
        if self.watch is not None and self.watch.frozen():
            raise Frozen(f"the process stood still for {self.watch.longest_gap_s:.1f} s: its partitions may be "
                         "another worker's by now")

    async def _commit(self) -> None:
        async with self._lock:
            if not self.dirty:
                return
            started = time.perf_counter()
            self.dirty = False
            epoch = self.wiring.switch()                                     # 1
            self.closed_at = asyncio.get_running_loop().time()
            try:
                self.wiring.flush_states(epoch)                              # 2
                if not await self._idle(epoch, self.model_wait_s):           # 3
                    self.wiring.carry(epoch)  # what still waits for the text model becomes state
                    while not await self._idle(epoch, WAITING_REPORT_S):  # the records' deliveries only
                        _log.warning("checkpoint still waiting for its rounds", extra={
                            "epoch": epoch, "waiting_for": self.wiring.epochs.waiting_for(epoch)})
                self.check_not_frozen()                                      # 4
                offsets = self.runner.take_offsets(epoch)
                ends = self.runner.offset_metadata(offsets)
                metadata = self.consumer.group_metadata()
                request = asyncio.get_running_loop().run_in_executor(                                  # 5
                    None, functools.partial(self.outbox.commit, offsets, metadata, timeout=COMMIT_TIMEOUT_S,
                                            guard=self.check_not_frozen, metadata=ends))
                try:
                    await asyncio.wait_for(asyncio.shield(request), COMMIT_TIMEOUT_S + COMMIT_HUNG_S)
                except asyncio.TimeoutError:
                    raise CommitHung(f"the transaction's commit has not returned in {COMMIT_TIMEOUT_S + COMMIT_HUNG_S:.0f}"
                                     " s, past its own timeout (librdkafka: a group coordinator gone, "
                                     "confluentinc/librdkafka#5456)") from None
            except BaseException:
                self.dirty = True  # still uncommitted (the worker stops)
                raise
            self.runner.offsets_committed(offsets)
            self.wiring.committed()                                          # 6
            self.outbox.advance()
            if self.purger is not None:                                      # 7
                self.purger.committed(offsets)
            self.commits += 1
            metrics.CHECKPOINT_DURATION.observe(time.perf_counter() - started)
