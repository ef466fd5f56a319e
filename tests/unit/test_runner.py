"""modpipe.streams.runtime.runner without a broker: a Runner built on a fake wiring (its GroupConsumer is never started), its
offsets bookkeeping (`_done`, `take_offsets`), the records dropped after a seek back (`_fresh`), the rounds
loops driven directly, and the rebalance callbacks."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest
from modpipe.streams import metrics
from modpipe.streams.kafka.records import TP, Record
from modpipe.streams.runtime import runner as runner_module
from modpipe.streams.runtime.runner import ROUND_MAX, Runner
from modpipe.streams.state.ends import ChangelogEnds, decode, encode

from modpipe.settings import Settings

POSTS, AWAITING, USER = "posts", "awaiting-text", "features.user"


class FakeTable:
    def __init__(self, name: str = "t"):
        self.name, self.changelog = name, f"cl-{name}"
        self.dropped: list[int] = []
        self.installed: list[int] = []  # partitions whose restore was installed
        self.abandoned: list[int] = []

    def drop(self, partition):
        self.dropped.append(partition)

    def restore_end(self, partition):
        self.installed.append(partition)

    def restore_abandon(self, partition):
        self.abandoned.append(partition)


class FakeBatcher:
    def __init__(self):
        self.full = False  # the decision queue within its posts and bytes
        self.emptied = asyncio.Event()  # set by the test: Triton batches took posts off

    async def room(self):
        await self.emptied.wait()
        self.full = False


class FakeWiring:
    def __init__(self):
        self.topics = SimpleNamespace(awaiting_text=AWAITING, stages={"user": USER})
        self.batcher = FakeBatcher()
        self.checkpoint_full = None  # the open checkpoint's decoded states within their share
        self.room = asyncio.Event()  # set by the test: the checkpoint wrote the states
        self.pipe = SimpleNamespace(tables={t: FakeTable(t) for t in ("user", "url", "domain", "ip", "post")},
                                    awaiting_model=FakeTable("awaiting-model"))
        self.restored_posts: list[list[int]] = []  # post-stage partitions whose carried posts were handed over
        self.crashes: list[Exception] = []
        self.revocations = 0
        self.open_epoch = 0
        self.changelog_ends = ChangelogEnds()
        self.owned: set[TP] = set()  # stage partitions whose tables are in (local hops)

    def assigned(self, tps):
        self.owned = {tp for tp in tps if tp.topic == USER}

    def observe_tables(self):
        pass

    def crash(self, exc):
        self.crashes.append(exc)

    def revoked(self, partitions=None):
        self.revocations += 1
        return 0

    def decide_restored(self, partitions):
        self.restored_posts.append(sorted(partitions))
        return 0

    async def idle(self, epoch=None):
        pass

    async def checkpoint_room(self):
        await self.room.wait()
        self.checkpoint_full = None


class FakeSeeks:
    def __init__(self):
        self.seeks: list[tuple[TP, int]] = []
        self.handed_bytes = 0
        self.committed: dict[TP, tuple[int, str | None]] = {}  # at the last assignment
        self.released: list[list[TP]] = []  # partitions held back at the assignment, as they were released

    def committed_at_assignment(self):
        return dict(self.committed)

    def seek(self, tp, offset):
        self.seeks.append((tp, offset))

    def release(self, tps):
        self.released.append(sorted(tps))


def make_runner(handlers=None, conf=None, env=None) -> Runner:
    handlers = handlers or {POSTS: lambda records: None, USER: lambda records: None, AWAITING: None}
    runner = Runner(Settings.from_env(env or {}), "b:9092", FakeWiring(), outbox=None, handlers=handlers,
                    consumer_conf=conf or {"session.timeout.ms": 10_000, "heartbeat.interval.ms": 2_000})
    runner.consumer = FakeSeeks()
    return runner


def records(topic: str, partition: int, offsets) -> list[Record]:
    return [Record(topic, partition, o, None, b"v") for o in offsets]


def test_the_freeze_limit_is_the_session_less_a_heartbeat():
    guarded = {"MODPIPE_FREEZE_GUARD": "on"}
    assert make_runner(env=guarded).watch.limit_s == 8.0
    assert make_runner(conf={"session.timeout.ms": 1_500, "heartbeat.interval.ms": 1_000},
                       env=guarded).watch.limit_s == 1.0


def test_without_the_freeze_guard_there_is_no_watch():
    """Apache Kafka fences a frozen member itself (MODPIPE_FREEZE_GUARD off, the default)."""
    assert make_runner().watch is None


def test_fetching_pauses_while_the_decision_queue_is_full():
    runner = make_runner()
    assert not runner._busy()
    runner.wiring.batcher.full = True  # its posts or its bytes
    assert runner._busy()


def test_a_fetched_batch_of_posts_starts_no_round_while_the_decision_queue_is_full():
    calls: list[list[int]] = []

    async def scenario():
        r = make_runner({POSTS: None, USER: None, AWAITING: None})
        # each round fills the queue (a round of posts adds up to ROUND_MAX of them)
        r.handlers[POSTS] = lambda rs: (calls.append([x.offset for x in rs]), setattr(r.wiring.batcher, "full", True))
        task = asyncio.get_running_loop().create_task(r._run())
        r._deliver(records(POSTS, 0, range(2 * ROUND_MAX)))
        await settle()
        waiting = len(calls)
        r.wiring.batcher.emptied.set()  # Triton took posts off
        await settle()
        task.cancel()
        return waiting

    assert asyncio.run(scenario()) == 1  # the batch's second round waited for room
    assert calls == [list(range(ROUND_MAX)), list(range(ROUND_MAX, 2 * ROUND_MAX))]


def test_a_round_started_before_the_batch_waits_for_room_is_due_for_a_checkpoint_meanwhile():
    """A fetched batch of posts is many rounds; while the rest wait for room in the decision queue, the rounds
    started are the open epoch's and a checkpoint is due for them. (Seen in a chaos run: Triton had been down,
    the queue was full, and a revocation found nothing to commit, returned at once and dropped the first round's
    posts from the queue: that round never completed, and the next checkpoint waited for it for good.)"""
    async def scenario():
        r = make_runner({POSTS: None, USER: None, AWAITING: None})
        r.handlers[POSTS] = lambda rs: setattr(r.wiring.batcher, "full", True)
        task = asyncio.get_running_loop().create_task(r._run())
        r._deliver(records(POSTS, 0, range(2 * ROUND_MAX)))
        await settle()
        due = r.checkpoint.dirty  # the second round waits for room
        task.cancel()
        return due

    assert asyncio.run(scenario()) is True


def test_fetching_pauses_while_the_fetched_records_are_over_their_bytes_and_resumes_as_rounds_take_them():
    runner = make_runner(env={"MODPIPE_WORKER_MEMORY_MB": "256"})  # 2 %: ~5 MiB
    big = [Record(POSTS, 0, o, b"k", b"x" * 1_000_000) for o in range(3)]
    runner._deliver(big)  # one batch of three 1 MB records: under MAX_QUEUED_BATCHES, under the bytes
    assert not runner._busy() and runner.fetched_bytes > 3_000_000
    runner._deliver([Record(POSTS, 0, o, b"k", b"x" * 1_000_000) for o in range(3, 6)])
    assert runner._busy()  # two batches, 6 MB
    assert runner._next_batch() is big and not runner._busy()
    runner._next_batch()
    assert runner.fetched_bytes == 0


def test_fetching_pauses_for_batches_handed_over_that_the_busy_loop_has_not_received_yet():
    from modpipe.streams.kafka.records import records_bytes

    runner = make_runner(env={"MODPIPE_WORKER_MEMORY_MB": "256"})  # 2 %: ~5 MiB
    batch = [Record(POSTS, 0, o, b"k", b"x" * 1_000_000) for o in range(6)]
    runner.consumer.handed_bytes = records_bytes(batch)  # the consumer's thread handed it; the loop is busy
    assert runner.fetched_bytes == 0 and runner._busy()
    runner._deliver(batch)  # the loop receives it: counted once, as fetched
    assert runner.fetched_bytes == records_bytes(batch) and runner._busy()
    runner._next_batch()
    assert not runner._busy()


def test_done_keeps_the_offset_after_the_last_record_per_partition_until_taken():
    r = make_runner()
    r._done(records(POSTS, 0, [5, 6, 7]) + records(POSTS, 1, [2]), 0)
    r._done(records(POSTS, 0, [8]), 0)
    r._done(records(POSTS, 0, [9]), 1)  # a round of the next checkpoint epoch: committed with that one
    assert r.take_offsets(0) == {TP(POSTS, 0): 9, TP(POSTS, 1): 3}
    assert r.take_offsets(0) == {}
    assert r.take_offsets(1) == {TP(POSTS, 0): 10}


def test_without_a_seek_back_every_record_is_fresh():
    r = make_runner()
    batch = records(POSTS, 0, [1, 2])
    assert r._fresh(batch) is batch


def test_after_a_seek_back_the_records_fetched_before_it_are_dropped():
    r = make_runner()
    r._read_again(records(AWAITING, 0, [10, 11, 12]) + records(AWAITING, 1, [4]))
    assert r.consumer.seeks == [(TP(AWAITING, 0), 10), (TP(AWAITING, 1), 4)]
    # fetched before the seek took effect: p0 13, 14 (stale) and p1 5; other partitions are not concerned
    stale = records(AWAITING, 0, [13, 14]) + records(AWAITING, 1, [5]) + records(POSTS, 0, [7])
    assert [(x.topic, x.offset) for x in r._fresh(stale)] == [(POSTS, 7)]
    again = records(AWAITING, 0, [10, 11]) + records(AWAITING, 1, [4, 5])
    assert [(x.partition, x.offset) for x in r._fresh(again)] == [(0, 10), (0, 11), (1, 4), (1, 5)]
    assert r._rewound == {}


async def settle(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_rounds_run_per_topic_in_chunks_and_record_their_offsets():
    calls: list[tuple[str, list[int]]] = []
    handlers = {POSTS: lambda rs: calls.append((POSTS, [x.offset for x in rs])),
                USER: lambda rs: calls.append((USER, [x.offset for x in rs])), AWAITING: None}

    async def scenario():
        r = make_runner(handlers)
        task = asyncio.get_running_loop().create_task(r._run())
        r._deliver(records(POSTS, 0, range(ROUND_MAX + 2)) + records(USER, 3, [40]) + records(AWAITING, 0, [1]))
        await settle()
        task.cancel()
        return r

    r = asyncio.run(scenario())
    assert calls == [(POSTS, list(range(ROUND_MAX))), (POSTS, [ROUND_MAX, ROUND_MAX + 1]), (USER, [40])]
    assert r.take_offsets(0) == {TP(POSTS, 0): ROUND_MAX + 2, TP(USER, 3): 41}
    assert [[x.offset for x in batch] for batch in r._awaiting] == [[1]]  # for the awaiting-text loop
    assert r.checkpoint.dirty  # a checkpoint is due


def test_no_round_starts_while_a_checkpoint_has_them_paused():
    calls: list = []

    async def scenario():
        r = make_runner({POSTS: calls.append, USER: None, AWAITING: None})
        task = asyncio.get_running_loop().create_task(r._run())
        r.pause_rounds()
        r._deliver(records(POSTS, 0, [1]))
        await settle()
        paused_calls = len(calls)
        r.resume_rounds()
        await settle()
        task.cancel()
        return paused_calls

    assert asyncio.run(scenario()) == 0 and len(calls) == 1


def test_rounds_wait_for_a_checkpoint_while_its_decoded_states_are_over_their_share_even_inside_a_batch():
    calls: list[list[int]] = []

    async def scenario():
        r = make_runner({POSTS: lambda rs: calls.append([x.offset for x in rs]), USER: None, AWAITING: None})
        task = asyncio.get_running_loop().create_task(r._run())
        r.wiring.checkpoint_full = "states"  # full after the round before this batch
        r._deliver(records(POSTS, 0, range(ROUND_MAX + 1)))
        await settle()
        waiting = (len(calls), r.checkpoint.dirty)
        r._deliver(records(POSTS, 0, [ROUND_MAX + 1]))
        r.wiring.room.set()  # the checkpoint wrote them
        await settle()
        task.cancel()
        return waiting

    # the batch's first round waits too (the states were full before it), and a checkpoint is due
    assert asyncio.run(scenario()) == (0, True)
    assert calls == [list(range(ROUND_MAX)), [ROUND_MAX], [ROUND_MAX + 1]]


def test_a_round_waiting_for_room_is_dropped_when_its_partitions_were_revoked_meanwhile():
    calls: list[list[int]] = []

    async def scenario():
        r = make_runner({POSTS: lambda rs: calls.append([x.offset for x in rs]), USER: None, AWAITING: None})
        task = asyncio.get_running_loop().create_task(r._run())
        # the first round fills them: the second waits inside the batch
        r.handlers[POSTS] = lambda rs: (calls.append([x.offset for x in rs]), setattr(r.wiring, "checkpoint_full", "states"))
        r._deliver(records(POSTS, 0, range(ROUND_MAX + 1)))
        await settle()
        r._generation += 1  # a revocation while it waited
        r.wiring.room.set()
        await settle()
        task.cancel()
        return r

    r = asyncio.run(scenario())
    assert calls == [list(range(ROUND_MAX))] and r.checkpoint.dirty
    assert r.take_offsets(0) == {TP(POSTS, 0): ROUND_MAX}  # the dropped round is read again, not committed


def test_awaiting_posts_are_read_again_while_the_text_model_is_out(monkeypatch):
    monkeypatch.setattr(runner_module, "AWAITING_TEXT_RETRY_S", 0)
    answers = [False, True]
    seen: list[list[int]] = []

    async def awaiting(rs, done, still_ours=lambda: True):
        seen.append([x.offset for x in rs])
        ok = answers.pop(0)
        if ok:
            done()
        return ok

    async def scenario():
        r = make_runner({POSTS: None, USER: None, AWAITING: awaiting})
        loop = asyncio.get_running_loop()
        tasks = [loop.create_task(r._run()), loop.create_task(r._run_awaiting())]
        r._deliver(records(AWAITING, 0, [3, 4]))
        await settle()
        assert r.consumer.seeks == [(TP(AWAITING, 0), 3)] and r.take_offsets(0) == {}
        r._deliver(records(AWAITING, 0, [5]))  # fetched before the seek: dropped
        r._deliver(records(AWAITING, 0, [3, 4, 5]))  # read again from 3
        await settle()
        for t in tasks:
            t.cancel()
        return r

    r = asyncio.run(scenario())
    assert seen == [[3, 4], [3, 4, 5]]
    assert r.take_offsets(0) == {TP(AWAITING, 0): 6}


def test_a_seek_back_loses_no_queued_awaiting_records_of_other_partitions(monkeypatch):
    monkeypatch.setattr(runner_module, "AWAITING_TEXT_RETRY_S", 0)

    async def awaiting(rs, done, still_ours=lambda: True):
        return False  # the text model is out

    async def scenario():
        r = make_runner({POSTS: None, USER: None, AWAITING: awaiting})
        r._awaiting.extend([records(AWAITING, 0, [3]), records(AWAITING, 1, [7])])  # two fetches queued
        r._awaiting_wake.set()
        task = asyncio.get_running_loop().create_task(r._run_awaiting())
        await settle()
        task.cancel()
        return r

    r = asyncio.run(scenario())
    # partition 1's record at offset 7 was dropped from the queue: it must be read again too
    assert (TP(AWAITING, 1), 7) in r.consumer.seeks or any(b[0].partition == 1 for b in r._awaiting)


def test_no_awaiting_record_of_a_revoked_partition_is_handled_after_the_revocation():
    handled: list[int] = []
    first_chunk_in_flight = None

    async def awaiting(rs, done, still_ours=lambda: True):
        handled.append(rs[0].offset)
        if len(handled) == 1:
            await first_chunk_in_flight.wait()  # waiting for Triton when the group takes the partition away
        done()  # as the handler does: with the decisions produced, before it yields again
        return True

    committed: list[dict] = []

    async def scenario():
        nonlocal first_chunk_in_flight
        first_chunk_in_flight = asyncio.Event()
        r = make_runner({POSTS: None, USER: None, AWAITING: awaiting})

        async def commit_all():  # as the checkpoint does: rounds paused, the round in flight completes, offsets taken
            r.pause_rounds()
            first_chunk_in_flight.set()
            await settle()
            committed.append(r.take_offsets(0))
            r.resume_rounds()
            return True

        r.checkpoint.commit_all = commit_all
        r._awaiting.append(records(AWAITING, 0, range(ROUND_MAX + 1)))  # two chunks
        r._awaiting_wake.set()
        task = asyncio.get_running_loop().create_task(r._run_awaiting())
        await settle()
        await r.on_revoked([TP(AWAITING, 0)])
        await settle()
        task.cancel()
        return r

    r = asyncio.run(scenario())
    assert handled == [0] and not any(r._offsets.values())
    assert committed == [{TP(AWAITING, 0): ROUND_MAX}]  # the decided chunk's offsets went with its decisions


def test_a_revocation_commits_then_forgets_the_partitions():
    async def scenario():
        r = make_runner()
        commits: list = []

        async def commit_all():
            commits.append(dict(r._offsets[0]))
            return True

        r.checkpoint.commit_all = commit_all
        r._deliver(records(POSTS, 0, [1]))  # fetched, not started
        r._done(records(USER, 2, [9]) + records(POSTS, 0, [0]), 0)
        await r.on_revoked([TP(USER, 2), TP(POSTS, 0)])
        return r, commits

    r, commits = asyncio.run(scenario())
    assert commits == [{TP(USER, 2): 10, TP(POSTS, 0): 1}]  # what was done is committed first
    assert not r._batches and not any(r._offsets.values()) and r.wiring.revocations == 1
    assert all(t.dropped == [2] for t in r.wiring.pipe.tables.values())  # stage partition 2 of every table


def test_a_revocation_after_a_crash_commits_nothing_and_lost_partitions_crash_the_worker():
    async def scenario():
        r = make_runner()
        commits: list = []

        async def commit_all():
            commits.append(1)
            return True

        r.checkpoint.commit_all = commit_all
        await r.on_lost([TP(POSTS, 0)])
        await r.on_revoked([TP(POSTS, 0)])
        return r, commits

    r, commits = asyncio.run(scenario())
    assert not r.committing_on_revoke and commits == [] and len(r.wiring.crashes) == 1


def test_the_assigned_partitions_gauge_drops_at_a_revocation_and_counts_only_restored_partitions(monkeypatch):
    """A scrape during a rebalance's table restore must not show the partitions the revocation took away, nor
    those whose tables are still being restored."""
    def gauge() -> float:
        return metrics.ASSIGNED_PARTITIONS.labels(POSTS)._value.get()

    during_restores: list[float] = []
    monkeypatch.setattr(runner_module.tables, "restore", lambda *args, **kwargs: during_restores.append(gauge()))

    async def scenario():
        r = make_runner()

        async def commit_all():
            return True

        r.checkpoint.commit_all = commit_all
        seen = []
        await r.on_assigned([TP(t, p) for t in (POSTS, USER) for p in range(4)])
        seen.append(gauge())  # all four held back until their tables are in
        await r._restoring
        seen.append(gauge())
        await r.on_revoked([TP(t, p) for t in (POSTS, USER) for p in range(4)])
        seen.append(gauge())
        await r.on_assigned([TP(t, p) for t in (POSTS, USER) for p in (0, 1)])
        await r._restoring
        seen.append(gauge())
        await r.on_lost([TP(POSTS, 0), TP(POSTS, 1)])
        seen.append(gauge())
        return seen

    assert asyncio.run(scenario()) == [0, 4, 0, 2, 0]
    # a partition is counted only once its own restore has ended
    assert len(during_restores) == 6 and max(during_restores[:4]) <= 3 and max(during_restores[4:]) <= 1


def test_an_assignment_returns_at_once_holding_back_each_partition_number_until_its_tables_are_restored(
        monkeypatch):
    """The group waits for no restore: the assignment callback only starts it and says which partitions to hold
    back (every input topic's partition whose number is a stage partition's); each number is released, and its
    stage partitions taken for local hops, once its tables are installed, while the rest are worked on, and a
    number whose restore waits holds back no other."""
    import threading

    gates = {p: threading.Event() for p in (1, 2)}

    def restore(tables, partitions, settings, bootstrap, ends=None, reached=None, install=True, cancelled=None):
        assert not install
        assert gates[partitions[0]].wait(5)
        return 0

    monkeypatch.setattr(runner_module.tables, "restore", restore)

    async def scenario():
        r = make_runner()
        held = await r.on_assigned([TP(POSTS, 1), TP(USER, 1), TP(POSTS, 2), TP(USER, 2), TP(POSTS, 3)])
        assert sorted(held) == sorted([TP(POSTS, 1), TP(POSTS, 2), TP(USER, 1), TP(USER, 2)])
        assert r._owned == {TP(POSTS, 3)} and r.wiring.owned == set()  # posts 3 has no tables: worked on at once
        gates[2].set()  # partition 1's restore still waits (a transaction open below its committed end)
        while not r.consumer.released:
            await asyncio.sleep(0.01)
        assert r.consumer.released == [sorted([TP(POSTS, 2), TP(USER, 2)])]
        assert r.wiring.owned == {TP(USER, 2)} and r.wiring.pipe.tables["user"].installed == [2]
        assert TP(USER, 1) not in r._owned
        gates[1].set()
        await r._restoring
        assert r.consumer.released[1] == sorted([TP(POSTS, 1), TP(USER, 1)])
        assert r.wiring.owned == {TP(USER, 1), TP(USER, 2)}
        assert r.wiring.restored_posts == []  # the fake wiring has no post stage
        return r

    asyncio.run(scenario())


def test_a_revocation_during_a_restore_calls_it_off_and_installs_nothing(monkeypatch):
    from modpipe.streams.state.tables import RestoreCancelled

    started = []

    def restore(tables, partitions, settings, bootstrap, ends=None, reached=None, install=True, cancelled=None):
        started.append(partitions[0])
        while not cancelled():  # a changelog held by an open transaction: the read waits
            time.sleep(0.01)
        raise RestoreCancelled("called off")

    monkeypatch.setattr(runner_module.tables, "restore", restore)

    async def scenario():
        r = make_runner()

        async def commit_all():
            return True

        r.checkpoint.commit_all = commit_all
        tps = [TP(POSTS, 0), TP(USER, 0), TP(POSTS, 1), TP(USER, 1)]
        await r.on_assigned(tps)
        while len(started) < 2:
            await asyncio.sleep(0.01)
        await asyncio.wait_for(r.on_revoked(tps), 5)
        return r

    r = asyncio.run(scenario())
    user = r.wiring.pipe.tables["user"]
    assert sorted(started) == [0, 1] and user.installed == [] and r.consumer.released == [] and r._owned == set()
    assert r.wiring.crashes == [] and sorted(user.dropped) == [0, 1]


def test_the_transaction_timeout_is_independent_of_triton():
    """No checkpoint holds its transaction open for Triton (posts still at Triton are carried as state), so
    transaction.timeout.ms is the same whatever the Triton and outage limits, and a setting that
    would not leave a checkpoint time to commit is refused."""
    from modpipe.streams.worker import transaction_timeout_s

    from modpipe.settings import SettingsError

    default = Settings.from_env({})
    # a dead worker holds read_committed readers this long plus the broker's abort check (10 s by default):
    # at most 30 s (tests/integration/test_killed_worker_hold.py measures it)
    assert transaction_timeout_s(default) <= 20
    assert transaction_timeout_s(default) >= 2 * (default.commit_interval_ms + default.checkpoint_model_wait_ms) / 1000
    for env in ({"MODPIPE_TEXT_MODEL_OUTAGE_S": "5000"}, {"MODPIPE_TEXT_MODEL_OUTAGE_POLICY": "wait"},
                {"MODPIPE_TRITON_TIMEOUT_S": "300"}):
        assert transaction_timeout_s(Settings.from_env(env)) == transaction_timeout_s(default), env
    for env in ({"MODPIPE_TRANSACTION_TIMEOUT_MS": "3000"}, {"MODPIPE_TRANSACTION_TIMEOUT_MS": "1000000"},
                {"MODPIPE_CHECKPOINT_MODEL_WAIT_MS": "100000"}):
        with pytest.raises(SettingsError):
            Settings.from_env(env)


def test_an_assignment_restores_each_table_to_the_end_committed_with_its_stage_partition(monkeypatch):
    restores: list = []

    def restore(tables, partitions, settings, bootstrap, ends=None, reached=None, install=True, cancelled=None):
        restores.append((sorted(t.name for t in tables), partitions, dict(ends)))
        reached.update({(t.changelog, p): ends.get((t.changelog, p), 7) for t in tables for p in partitions})
        return 0

    monkeypatch.setattr(runner_module.tables, "restore", restore)

    async def scenario():
        r = make_runner()
        r.wiring.assigned = lambda tps: None
        # partition 2's offset was committed before the ends were carried: restored to the last stable offset (7)
        r.consumer.committed = {TP(USER, 1): (40, encode({"user": 12})), TP(USER, 2): (5, None),
                                TP(POSTS, 1): (3, None)}
        await r.on_assigned([TP(USER, 1), TP(USER, 2), TP(POSTS, 1)])
        await r._restoring
        return r

    r = asyncio.run(scenario())
    assert sorted(restores) == [(["user"], [1], {("cl-user", 1): 12}), (["user"], [2], {("cl-user", 1): 12})]
    assert r.wiring.changelog_ends.committed == {("user", 1): 12, ("user", 2): 7}
    # a checkpoint that wrote user partition 2's changelog without a round of it (a local hop, a tombstone) commits
    # that partition's offset unchanged, with the new end
    r.wiring.changelog_ends.delivered("user", 2, 20)
    r._done(records(POSTS, 1, [3]), 0)
    offsets = r.take_offsets(0)
    assert offsets == {TP(POSTS, 1): 4, TP(USER, 2): 5}
    metadata = r.offset_metadata(offsets)
    assert list(metadata) == [TP(USER, 2)] and decode(metadata[TP(USER, 2)]) == {"user": 21}
    r.offsets_committed(offsets)
    r.wiring.changelog_ends.commit()
    # nothing processed, nothing written: still every owned stage partition's offset, none commits without
    assert r.take_offsets(1) == {TP(USER, 1): 40, TP(USER, 2): 5}
    assert decode(r.offset_metadata({TP(USER, 1): 40})[TP(USER, 1)]) == {"user": 12}
