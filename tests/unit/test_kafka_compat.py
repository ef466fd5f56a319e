"""The client-side fixes of streams/kafka_compat.py that are pure logic."""

from __future__ import annotations

from streams.kafka_compat import (
    EMPTY_FETCH_BACKOFF_BACKLOG_MAX_S,
    EMPTY_FETCH_BACKOFF_MAX_S,
    EMPTY_FETCH_BACKOFF_S,
    empty_fetch_backoff,
)


def test_no_wait_while_fetches_bring_records():
    assert empty_fetch_backoff(0) == 0.0


def test_wait_doubles_with_each_empty_fetch_up_to_the_cap():
    waits = [empty_fetch_backoff(n) for n in range(1, 12)]
    assert waits[0] == EMPTY_FETCH_BACKOFF_S
    assert all(b == min(2 * a, EMPTY_FETCH_BACKOFF_MAX_S) for a, b in zip(waits, waits[1:], strict=False))
    assert max(waits) == EMPTY_FETCH_BACKOFF_MAX_S  # an idle worker still looks ~40 times a second


def test_a_backlog_waits_longer_between_empty_fetches():
    assert empty_fetch_backoff(30, backlog=True) == EMPTY_FETCH_BACKOFF_BACKLOG_MAX_S > EMPTY_FETCH_BACKOFF_MAX_S
    assert empty_fetch_backoff(1, backlog=True) == EMPTY_FETCH_BACKOFF_S  # the first waits are as short


def test_a_long_idle_spell_keeps_the_cap():
    # 2 ** n overflowed a float after ~1,000 empty fetches and killed aiokafka's fetcher routine
    assert empty_fetch_backoff(5_000) == empty_fetch_backoff(10**9) == EMPTY_FETCH_BACKOFF_MAX_S


def test_a_failed_commit_is_undone_so_the_next_round_commits_again():
    from collections import defaultdict

    from streams.kafka_compat import undo_failed_commit

    committed = defaultdict(lambda: None, {"a": 10, "b": 5})
    offsets = {"a": 12, "b": 7, "c": 3}
    before = {tp: committed.get(tp) for tp in offsets}
    committed.update(offsets)  # what faust does whatever the broker answered
    committed["b"] = 9  # a later successful commit of b must stay
    undo_failed_commit(committed, offsets, before)
    assert committed["a"] == 10 and committed["b"] == 9 and committed["c"] is None


class _Message:
    def __init__(self, tp, offset, acked=False):
        self.tp, self.offset, self.acked = tp, offset, acked


class _ConsumerState:
    """The attributes faust's Consumer._new_offset reads."""

    def __init__(self, committed, acked, unacked=(), tp="tp"):
        from collections import defaultdict

        from intervaltree import IntervalTree

        self._committed_offset = defaultdict(lambda: None, {tp: committed})
        self._acked = defaultdict(list, {tp: list(acked)})
        self._acked_index = defaultdict(set, {tp: set(acked)})
        self._gap = defaultdict(IntervalTree)
        self._unacked_messages = set(unacked)
        self._assigned = {tp}
        self.sought = []

    def assignment(self):
        return self._assigned

    async def seek(self, tp, offset):
        self.sought.append((tp, offset))


def _fetched(*offsets, floor=None):
    from streams.kafka_compat import FetchedOffsets

    track = FetchedOffsets()
    track.sought(floor)
    for offset in offsets:
        track.fetched(offset)
    return track


def test_no_commit_past_a_record_still_in_flight(monkeypatch):
    from faust.transport.consumer import Consumer

    from streams import kafka_compat

    monkeypatch.setattr(kafka_compat, "_fetched", {"tp": _fetched(*range(100, 103))})
    original = Consumer._new_offset if Consumer._new_offset is not kafka_compat._new_offset else None
    if original is not None:  # faust alone: committed 100 (next to read), 101 and 102 acked, 100 in flight -> 103
        assert original(_ConsumerState(100, [101, 102], [_Message("tp", 100)]), "tp") == 103
    held = _ConsumerState(100, [101, 102], [_Message("tp", 100)])
    assert kafka_compat._new_offset(held, "tp") is None
    assert held._acked["tp"] == [101, 102]  # kept for the commit that follows
    held._acked["tp"].append(100)
    held._unacked_messages = {_Message("tp", 100, acked=True)}
    assert kafka_compat._new_offset(held, "tp") == 103
    assert held._acked["tp"] == [] and held._acked_index["tp"] == set()
    # a record in flight above the acked run does not hold the run back
    assert kafka_compat._new_offset(_ConsumerState(100, [100, 101], [_Message("tp", 105)]), "tp") == 102
    # acks below the committed offset (an older assignment's) are forgotten
    old = _ConsumerState(100, [50, 100])
    assert kafka_compat._new_offset(old, "tp") == 101 and old._acked["tp"] == []
    kafka_compat.install()
    assert Consumer._new_offset is kafka_compat._new_offset


def test_nothing_committed_yet_counts_from_the_partitions_beginning(monkeypatch):
    from streams import kafka_compat

    # faust did not check a partition without a committed offset at all: 1 acked, 0 dropped -> it committed 2
    monkeypatch.setattr(kafka_compat, "_fetched", {"tp": _fetched(0, 1, 2, floor=0)})
    assert kafka_compat._new_offset(_ConsumerState(None, [1]), "tp") is None
    assert kafka_compat._new_offset(_ConsumerState(None, [0, 1]), "tp") == 2
    # a batch fetched before the seek and handed over after it (offset 40) does not move the start
    monkeypatch.setattr(kafka_compat, "_fetched", {"tp": _fetched(40, 41, 0, 1, floor=0)})
    assert kafka_compat._new_offset(_ConsumerState(None, [40, 41]), "tp") is None
    monkeypatch.setattr(kafka_compat, "_fetched", {"tp": _fetched(5, 6)})  # no seek yet: nothing to count from
    assert kafka_compat._new_offset(_ConsumerState(None, [5]), "tp") is None


def test_holes_in_the_log_are_passed_but_a_dropped_record_is_not(monkeypatch):
    from streams import kafka_compat

    # 3 is a transaction marker (never fetched); 7 was fetched and never acked
    monkeypatch.setattr(kafka_compat, "_fetched", {"tp": _fetched(0, 1, 2, 4, 5, 6, 7, 8)})
    state = _ConsumerState(0, [0, 1, 2, 4, 5, 6, 8])
    assert kafka_compat._new_offset(state, "tp") == 7
    assert state._acked["tp"] == [8]
    assert kafka_compat.committable(10, {10, 11, 15}, [(12, 15)]) == 16
    assert kafka_compat.committable(10, {11}, [(12, 15)]) == 10


def test_a_record_dropped_without_being_processed_is_read_again(monkeypatch):
    import asyncio

    from faust.types import TP

    from streams import kafka_compat

    tp = TP("posts", 3)
    monkeypatch.setattr(kafka_compat, "_fetched", {tp: _fetched(0, 1, 2, 3)})
    clock = [1000.0]
    monkeypatch.setattr(kafka_compat.time, "monotonic", lambda: clock[0])

    async def commit_rounds():
        state = _ConsumerState(1, [2, 3], tp=tp)  # 1 was dropped: not acked, not in flight
        assert kafka_compat._new_offset(state, tp) is None
        clock[0] += kafka_compat.REWIND_AFTER_S - 0.1
        assert kafka_compat._new_offset(state, tp) is None
        await asyncio.sleep(0)
        assert state.sought == []  # not yet: it may still be on its way
        clock[0] += 0.2
        kafka_compat._new_offset(state, tp)
        await asyncio.sleep(0)
        assert state.sought == [(tp, 1)]
        in_flight = _ConsumerState(1, [2, 3], [_Message(tp, 1)], tp=tp)  # being processed: never rewound
        clock[0] += 100
        kafka_compat._new_offset(in_flight, tp)
        clock[0] += 100
        kafka_compat._new_offset(in_flight, tp)
        await asyncio.sleep(0)
        assert in_flight.sought == []

    asyncio.run(commit_rounds())


def test_partitions_no_longer_assigned_are_not_committed(monkeypatch):
    from faust.transport.consumer import Consumer

    from streams import kafka_compat

    monkeypatch.setattr(kafka_compat, "_fetched", {"tp": _fetched(0, 1), "gone": _fetched(0, 1)})
    monkeypatch.setattr(kafka_compat, "_original_filter_committable",
                        lambda self, tps: {tp: self._new_offset(tp) for tp in tps})
    state = _ConsumerState(0, [0, 1])
    state._acked["gone"], state._acked_index["gone"] = [0, 1], {0, 1}
    state._new_offset = lambda tp: kafka_compat._new_offset(state, tp)
    assert kafka_compat._filter_committable_offsets(state, ["tp", "gone"]) == {"tp": 2}
    assert "gone" not in state._acked  # its acks are the new owner's business
    assert Consumer._filter_committable_offsets is not None


def test_only_committing_topics_without_a_commit_are_sought_to_the_beginning():
    from collections import namedtuple

    from streams.kafka_compat import without_commit

    TP = namedtuple("TP", "topic partition")
    committed = {TP("posts", 0): 12, TP("posts", 1): None, TP("posts", 2): 0, TP("t-changelog", 0): None}
    assert without_commit(committed, lambda topic: topic == "posts") == [TP("posts", 1), TP("posts", 2)]
