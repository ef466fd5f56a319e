"""modpipe.streams.checkpointing.checkpoint without a broker: FreezeWatch on a fake clock, and the Checkpointer's steps (the order
documented at the top of streams/checkpointing/checkpoint.py) against fake runner, wiring, outbox and consumer."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from modpipe.streams.checkpointing import checkpoint as checkpoint_module
from modpipe.streams.checkpointing.checkpoint import Checkpointer, CommitHung, Epochs, FreezeWatch, Frozen


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_ticks_closer_than_the_limit_are_no_freeze():
    clock = Clock()
    watch = FreezeWatch(limit_s=8.0, tick_s=0.2, clock=clock)
    for _ in range(100):
        clock.now += 0.2
        watch.tick()
    clock.now += 7.9  # a slow tick, still under the limit
    watch.tick()
    assert not watch.frozen() and watch.longest_gap_s == pytest.approx(7.9)


def test_a_gap_past_the_limit_is_seen_and_remembered():
    clock = Clock()
    watch = FreezeWatch(limit_s=8.0, clock=clock)
    clock.now += 0.2
    watch.tick()
    clock.now += 9.0  # SIGSTOP, VM pause: no thread ran
    watch.tick()
    for _ in range(50):  # ticking normally again afterwards does not clear it
        clock.now += 0.2
        watch.tick()
    assert watch.frozen() and watch.longest_gap_s == pytest.approx(9.0)


def test_a_freeze_under_way_is_seen_before_the_next_tick():
    clock = Clock()
    watch = FreezeWatch(limit_s=8.0, clock=clock)
    clock.now += 8.5  # the checkpoint runs first after the process resumes
    assert watch.frozen()


def test_the_watch_thread_ticks_until_stopped():
    watch = FreezeWatch(limit_s=60.0, tick_s=0.01).start()
    first = watch.last_tick
    deadline = time.monotonic() + 5
    while watch.last_tick == first and time.monotonic() < deadline:
        time.sleep(0.01)
    watch.stop()
    assert watch.last_tick > first and not watch.frozen()


# -- the Checkpointer


class Steps(list):
    """The calls made, in order."""


class FakeRunner:
    def __init__(self, steps: Steps, offsets: dict):
        self.steps, self.offsets = steps, offsets  # the offsets of epoch 0; later epochs: {}

    def pause_rounds(self):
        self.steps.append("pause_rounds")

    def resume_rounds(self):
        self.steps.append("resume_rounds")

    def take_offsets(self, epoch):
        self.steps.append("take_offsets")
        offsets, self.offsets = self.offsets, {}
        return offsets

    def offset_metadata(self, offsets):
        return {tp: f"ends of {tp[0]}" for tp in offsets if tp[0].startswith("features.")}

    def offsets_committed(self, offsets):
        self.steps.append("offsets_committed")


class FakeWiring:
    def __init__(self, steps: Steps):
        self.steps = steps
        self.crashes: list[Exception] = []
        self.open_epoch = 0
        self.flushed: list[int] = []

    def switch(self):
        self.steps.append("switch")
        self.open_epoch += 1
        return self.open_epoch - 1

    async def idle(self, epoch=None):
        self.steps.append("idle")
        await asyncio.sleep(0)

    def flush_states(self, epoch):
        self.steps.append("flush_states")
        self.flushed.append(epoch)

    def committed(self):
        self.steps.append("committed")

    def expiry_due(self):
        return False

    def crash(self, exc):
        self.steps.append("crash")
        self.crashes.append(exc)


class FakeOutbox:
    def __init__(self, steps: Steps, fail: Exception | None = None):
        self.steps, self.fail = steps, fail
        self.commits: list[tuple] = []
        self.metadata: list[dict] = []
        self.hang: threading.Event | None = None  # set: the commit returns

    def commit(self, offsets, group_metadata, timeout=60.0, guard=None, metadata=None):
        if guard is not None:
            guard()  # as the outbox does, right before its requests
        self.steps.append("outbox.commit")
        if self.hang is not None:  # librdkafka blocked past its own timeout (confluentinc/librdkafka#5456)
            self.hang.wait(30)
        if self.fail is not None:
            raise self.fail
        self.commits.append((offsets, group_metadata))
        self.metadata.append(metadata)

    def advance(self):
        self.steps.append("outbox.advance")


class FakeConsumer:
    def __init__(self, steps: Steps):
        self.steps = steps

    def group_metadata(self):
        self.steps.append("group_metadata")
        return "generation-7"


class FakeWatch:
    """Frozen from its `frozen_from`-th check on (1: the first; None: never)."""

    def __init__(self, steps: Steps, frozen: bool = False, frozen_from: int | None = None):
        self.steps = steps
        self.frozen_from = 1 if frozen else frozen_from
        self.checks = 0
        self.longest_gap_s = 12.0 if self.frozen_from else 0.1

    def frozen(self):
        self.steps.append("freeze_check")
        self.checks += 1
        return self.frozen_from is not None and self.checks >= self.frozen_from


class FakePurger:
    def __init__(self, steps: Steps):
        self.steps = steps
        self.offsets: list[dict] = []

    def committed(self, offsets):
        self.steps.append("purger.committed")
        self.offsets.append(offsets)


def checkpointer(*, frozen=False, fail=None, offsets=None, interval_s=60.0, frozen_from=None):
    steps = Steps()
    runner = FakeRunner(steps, {("posts", 0): 11, ("features.user", 2): 4} if offsets is None else offsets)
    cp = Checkpointer(runner, FakeWiring(steps), FakeOutbox(steps, fail), FakeConsumer(steps), interval_s,
                      FakeWatch(steps, frozen, frozen_from), purger=FakePurger(steps))
    return cp, steps


def test_the_steps_happen_in_the_documented_order():
    async def scenario():
        cp, steps = checkpointer()
        cp.processed()
        assert await cp.commit()
        return cp, steps

    cp, steps = asyncio.run(scenario())
    assert steps == ["switch", "flush_states", "idle", "freeze_check", "take_offsets", "group_metadata",
                     "freeze_check", "outbox.commit", "offsets_committed", "committed", "outbox.advance",
                     "purger.committed"]
    assert cp.outbox.commits == [({("posts", 0): 11, ("features.user", 2): 4}, "generation-7")]
    # a stage partition's offset goes with its tables' changelog ends, in the same request
    assert cp.outbox.metadata == [{("features.user", 2): "ends of features.user"}]
    # the purger hears of offsets only once their transaction has committed
    assert cp.purger.offsets == [{("posts", 0): 11, ("features.user", 2): 4}]
    assert cp.wiring.flushed == [0] and cp.wiring.open_epoch == 1  # epoch 0 committed, rounds go on in 1
    assert cp.commits == 1 and not cp.dirty and not cp.wiring.crashes


def test_nothing_is_committed_when_nothing_was_processed():
    async def scenario():
        cp, steps = checkpointer()
        assert await cp.commit()
        cp.processed()
        assert await cp.commit()
        del steps[:]
        assert await cp.commit()  # nothing since the last one
        return cp, steps

    cp, steps = asyncio.run(scenario())
    assert steps == [] and cp.commits == 1 and len(cp.outbox.commits) == 1


def test_a_frozen_process_crashes_without_committing():
    async def scenario():
        cp, steps = checkpointer(frozen=True)
        cp.processed()
        return cp, steps, await cp.commit()

    cp, steps, ok = asyncio.run(scenario())
    # no offsets taken, no outbox.commit, no advance: the open transaction is aborted
    assert not ok and steps == ["switch", "flush_states", "idle", "freeze_check", "crash"]  # the stores take nothing
    assert len(cp.wiring.crashes) == 1 and isinstance(cp.wiring.crashes[0], Frozen)
    assert cp.commits == 0 and cp.dirty  # still uncommitted


def test_a_freeze_after_the_first_check_is_caught_before_the_offsets_are_sent():
    async def scenario():
        cp, steps = checkpointer(frozen_from=2)  # the process stands still between step 4 and step 5
        cp.processed()
        return cp, steps, await cp.commit()

    cp, steps, ok = asyncio.run(scenario())
    assert not ok and steps[-4:] == ["take_offsets", "group_metadata", "freeze_check", "crash"]
    assert cp.outbox.commits == [] and isinstance(cp.wiring.crashes[0], Frozen)


def test_a_failing_outbox_commit_crashes_the_wiring_and_holds_the_next_epoch_back():
    async def scenario():
        cp, steps = checkpointer(fail=RuntimeError("transaction coordinator gone"))
        cp.processed()
        return cp, steps, await cp.commit()

    cp, steps, ok = asyncio.run(scenario())
    assert not ok and steps[-2:] == ["outbox.commit", "crash"] and "outbox.advance" not in steps
    assert cp.purger.offsets == []  # uncommitted offsets are never purged behind
    assert [str(e) for e in cp.wiring.crashes] == ["transaction coordinator gone"]
    assert cp.commits == 0 and cp.dirty


def test_a_commit_blocked_past_its_own_timeout_crashes_the_worker_instead_of_holding_it(monkeypatch):
    """librdkafka's send_offsets_to_transaction can wait for ever for a group coordinator that is gone
    (confluentinc/librdkafka#5456): inside a revocation that held the whole group (modpipe chaos)."""
    monkeypatch.setattr(checkpoint_module, "COMMIT_TIMEOUT_S", 0.2)
    monkeypatch.setattr(checkpoint_module, "COMMIT_HUNG_S", 0.3)

    async def scenario():
        cp, steps = checkpointer()
        cp.outbox.hang = threading.Event()
        cp.processed()
        started = time.monotonic()
        try:
            ok = await cp.commit()
        finally:
            cp.outbox.hang.set()
        return cp, steps, ok, time.monotonic() - started

    cp, steps, ok, took = asyncio.run(scenario())
    assert not ok and steps[-2:] == ["outbox.commit", "crash"] and "outbox.advance" not in steps
    assert isinstance(cp.wiring.crashes[0], CommitHung) and 0.5 <= took < 5
    assert cp.commits == 0 and cp.dirty


class BusyWiring(FakeWiring):
    """The open epoch's rounds stay in flight; a closed epoch's complete."""

    async def idle(self, epoch=None):
        self.steps.append(f"idle {epoch}")
        if epoch == self.open_epoch:
            await asyncio.sleep(3600)


async def first_commit(cp: Checkpointer, limit_s: float = 5.0) -> float:
    """Runs the checkpoint task from a round's start until its first commit; returns how long that took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    task = loop.create_task(cp.run_forever())
    cp.processed()
    while not cp.commits and loop.time() - started < limit_s:
        await asyncio.sleep(0.01)
    task.cancel()
    return loop.time() - started


def test_a_quiet_pipeline_commits_at_once_and_a_busy_one_within_the_interval():
    async def quiet():
        cp, steps = checkpointer(interval_s=60.0)
        cp.closed_at = asyncio.get_running_loop().time()  # an epoch closed just now: the interval runs
        took = await first_commit(cp, limit_s=1.0)
        return cp.commits, took

    commits, _ = asyncio.run(quiet())
    assert commits == 1  # nothing in flight: no need to wait 60 s

    async def busy():
        steps = Steps()
        cp = Checkpointer(FakeRunner(steps, {("posts", 0): 1}), BusyWiring(steps), FakeOutbox(steps),
                          FakeConsumer(steps), 0.05, FakeWatch(steps))
        cp.closed_at = asyncio.get_running_loop().time()
        took = await first_commit(cp)
        return cp.commits, took

    commits, took = asyncio.run(busy())
    assert commits == 1 and 0.04 <= took < 5


def test_an_epoch_closes_at_once_when_the_interval_has_passed():
    """The first post after a quiet spell closes its epoch as it starts: a post arriving while it is at
    Triton belongs to the next epoch, and the first decision does not wait for the second."""
    async def scenario():
        steps = Steps()
        cp = Checkpointer(FakeRunner(steps, {("posts", 0): 1}), BusyWiring(steps), FakeOutbox(steps),
                          FakeConsumer(steps), 60.0, FakeWatch(steps))
        await first_commit(cp)
        return cp, steps

    cp, steps = asyncio.run(scenario())
    assert cp.commits == 1 and steps[:3] == ["switch", "flush_states", "idle 0"]  # never waited for epoch 0 open


def test_commit_all_pauses_rounds_and_commits_every_epoch_after_the_one_under_way():
    async def scenario():
        steps = Steps()
        wiring = EventWiring(steps)
        cp = Checkpointer(FakeRunner(steps, {("posts", 0): 1}), wiring, FakeOutbox(steps), FakeConsumer(steps),
                          60.0, FakeWatch(steps))
        cp.processed()
        under_way = asyncio.get_running_loop().create_task(cp.commit())  # epoch 0 waits for its rounds
        for _ in range(3):
            await asyncio.sleep(0)
        cp.processed()  # a round of epoch 1 started meanwhile
        all_done = asyncio.get_running_loop().create_task(cp.commit_all())
        for _ in range(3):
            await asyncio.sleep(0)
        wiring.rounds_done.set()
        return cp, steps, await under_way, await all_done

    cp, steps, first, ok = asyncio.run(scenario())
    assert first and ok and cp.commits == 2 and not cp.dirty
    assert steps[0] == "switch" and "pause_rounds" in steps and steps[-1] == "resume_rounds"
    assert steps.count("outbox.commit") == 2 and steps.count("outbox.advance") == 2
    assert cp.outbox.commits == [({("posts", 0): 1}, "generation-7"), ({}, "generation-7")]


def test_a_quiet_worker_checkpoints_when_table_keys_are_past_their_retention():
    """No record processed, but keys to forget: one checkpoint writes their tombstones (without offsets)."""
    class ExpiringWiring(FakeWiring):
        due = True

        def expiry_due(self):
            return self.due

        def flush_states(self, epoch):
            super().flush_states(epoch)
            self.due = False  # the flush forgot them

    async def scenario():
        steps = Steps()
        cp = Checkpointer(FakeRunner(steps, {}), ExpiringWiring(steps), FakeOutbox(steps), FakeConsumer(steps),
                          60.0, FakeWatch(steps), expiry_check_s=0.01)
        tasks = [asyncio.get_running_loop().create_task(cp.run_forever()),
                 asyncio.get_running_loop().create_task(cp.expire_forever())]
        await asyncio.sleep(0.3)
        for task in tasks:
            task.cancel()
        return cp, steps

    cp, steps = asyncio.run(scenario())
    assert cp.commits == 1 and steps.count("flush_states") == 1 and cp.outbox.commits == [({}, "generation-7")]
    assert not cp.dirty


class EventWiring(FakeWiring):
    """Rounds in flight until the test sets `rounds_done`."""

    def __init__(self, steps: Steps):
        super().__init__(steps)
        self.rounds_done = asyncio.Event()

    async def idle(self, epoch=None):
        self.steps.append("idle")
        await self.rounds_done.wait()


def test_a_stop_that_comes_as_the_rounds_complete_still_ends_the_checkpoint_task():
    """A worker's stop cancels this task. If its rounds complete in the same pass of the loop as the
    cancellation (a busy worker told to stop), the cancellation must still end the task: Python 3.11's
    asyncio.wait_for returned the inner result there and swallowed it, the task went back to waiting for
    the next checkpoint, and the worker's stop waited for it until it was SIGKILLed."""
    async def scenario():
        steps = Steps()
        wiring = EventWiring(steps)
        cp = Checkpointer(FakeRunner(steps, {("posts", 0): 1}), wiring, FakeOutbox(steps), FakeConsumer(steps),
                          60.0, FakeWatch(steps))
        cp.closed_at = asyncio.get_running_loop().time()  # an epoch closed just now: the interval runs
        task = asyncio.get_running_loop().create_task(cp.run_forever())
        cp.processed()
        for _ in range(3):  # the task is now waiting for the rounds, the interval not yet over
            await asyncio.sleep(0)
        assert steps == ["idle"]
        wiring.rounds_done.set()
        task.cancel()
        await asyncio.wait({task}, timeout=2)
        # read here: asyncio.run cancels whatever is left when it returns
        return task.done() and task.cancelled(), steps

    ended, steps = asyncio.run(scenario())
    assert ended, steps


# -- Epochs


def test_a_closed_epoch_is_idle_when_its_own_rounds_are_complete_whatever_the_next_one_holds():
    async def scenario():
        epochs = Epochs()
        first = epochs.opened(print)
        assert epochs.switch() == 0 and epochs.open_epoch == 1
        later = epochs.opened(print)  # a round of epoch 1, still at Triton
        assert (first.epoch, later.epoch) == (0, 1) and epochs.open_rounds == 2
        waiting = asyncio.get_running_loop().create_task(epochs.idle(0))
        await asyncio.sleep(0)
        assert not waiting.done()
        first.seal()
        await asyncio.wait_for(waiting, 1)  # epoch 1's round does not hold epoch 0 up
        everything = asyncio.get_running_loop().create_task(epochs.idle())
        await asyncio.sleep(0)
        assert not everything.done() and epochs.open_rounds == 1
        later.seal()
        await asyncio.wait_for(everything, 1)
        return epochs

    assert asyncio.run(scenario()).open_rounds == 0


def test_a_checkpoints_own_writes_join_the_epoch_it_closed():
    async def scenario():
        epochs = Epochs()
        epochs.switch()
        writes = epochs.opened(print, epoch=0)  # the changelog records of epoch 0, written after it closed
        waiting = asyncio.get_running_loop().create_task(epochs.idle(0))
        await asyncio.sleep(0)
        assert not waiting.done() and writes.epoch == 0
        writes.seal()
        await asyncio.wait_for(waiting, 1)

    asyncio.run(scenario())


def test_a_checkpoint_waiting_for_rounds_gives_up_when_the_worker_is_abandoned():
    """A revocation's commit_all waits (step 3) for rounds that a failed worker will never complete; abandoned,
    it returns without committing, so the consumer's revocation callback returns and it can leave the group."""
    async def scenario():
        cp, steps = checkpointer()
        forever = asyncio.Event()

        async def never_idle(epoch=None):
            steps.append("idle")
            await forever.wait()

        cp.wiring.idle = never_idle
        cp.processed()
        revoking = asyncio.ensure_future(cp.commit_all())
        await asyncio.sleep(0.05)
        assert not revoking.done()  # waiting for its rounds
        cp.abandon()
        ok = await asyncio.wait_for(revoking, 1.0)
        cp.processed()
        again = await asyncio.wait_for(cp.commit_all(), 1.0)
        return ok, again, cp, steps

    ok, again, cp, steps = asyncio.run(scenario())
    assert ok is False and again is False
    assert "outbox.commit" not in steps and cp.outbox.commits == [] and cp.commits == 0
    assert cp.dirty  # still uncommitted: its input is processed again by the partitions' next owner
