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

    def __init__(self, committed, acked, unacked):
        from collections import defaultdict

        from intervaltree import IntervalTree

        self._committed_offset = defaultdict(lambda: None, {"tp": committed})
        self._acked = defaultdict(list, {"tp": list(acked)})
        self._acked_index = defaultdict(set, {"tp": set(acked)})
        self._gap = defaultdict(IntervalTree)
        self._unacked_messages = set(unacked)


def test_no_commit_past_a_record_still_in_flight():
    from faust.transport.consumer import Consumer

    from streams import kafka_compat

    original = kafka_compat._original_new_offset
    # committed 100 (next to read), 101 and 102 acked, 100 still being decided: faust alone commits 103
    assert original(_ConsumerState(100, [101, 102], [_Message("tp", 100)]), "tp") == 103
    held = _ConsumerState(100, [101, 102], [_Message("tp", 100)])
    assert kafka_compat._new_offset(held, "tp") is None
    assert held._acked["tp"] == [101, 102]  # kept for the commit that follows
    held._acked["tp"].append(100)
    held._unacked_messages = {_Message("tp", 100, acked=True)}
    assert kafka_compat._new_offset(held, "tp") == 103
    # a record in flight above the acked run does not hold the run back; another partition's neither
    assert kafka_compat._new_offset(_ConsumerState(100, [100, 101], [_Message("tp", 105)]), "tp") == 102
    assert kafka_compat._new_offset(_ConsumerState(100, [101], [_Message("other", 100)]), "tp") == 102
    # a message below the committed offset (an older assignment's) is not waited for
    assert kafka_compat._new_offset(_ConsumerState(100, [100], [_Message("tp", 50)]), "tp") == 101
    kafka_compat.install()
    assert Consumer._new_offset is kafka_compat._new_offset
