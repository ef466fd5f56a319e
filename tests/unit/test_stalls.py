"""modpipe.streams.kafka.stalls: which assigned partitions have records to give and gave none for `stall_s`."""

from __future__ import annotations

from modpipe.streams.kafka.stalls import FetchWatch


def test_a_partition_behind_its_end_and_quiet_for_stall_s_is_stalled():
    w = FetchWatch(stall_s=30)
    w.assigned(["a", "b"], {"a": 10, "b": 5}, now=0)
    w.moved("a", 11, now=1)
    w.moved("b", 6, now=1)
    assert w.quiet(now=20) == [] and w.stalled({"a": 50, "b": 6}, now=20) == []
    assert sorted(w.quiet(now=31)) == ["a", "b"]
    # a has records from 11 to 50 it never gave; b is at its end (idle, not stalled)
    assert w.stalled({"a": 50, "b": 6}, now=31) == ["a"]
    assert w.quiet(now=32) == ["a"]  # b counts as moving again: asked again stall_s later


def test_an_end_of_partition_event_moves_it_past_a_transaction_marker():
    """read_committed: the last record is at 9, the commit marker at 10, the last stable offset 11; the fetch's
    end-of-partition event at 11 says the partition has nothing more to give."""
    w = FetchWatch(stall_s=5)
    w.assigned(["p"], {"p": 0}, now=0)
    w.moved("p", 10, now=1)
    assert w.stalled({"p": 11}, now=7) == ["p"]
    w.assigned(["p"], {"p": 0}, now=0)
    w.moved("p", 10, now=1)
    w.moved("p", 11, now=1)  # the end-of-partition event's offset
    assert w.stalled({"p": 11}, now=7) == []


def test_a_partition_never_delivered_is_judged_from_its_committed_offset_or_not_at_all():
    w = FetchWatch(stall_s=5)
    w.assigned(["known", "unknown", "none"], {"known": 40, "none": -1001}, now=0)
    ends = {"known": 45, "unknown": 45, "none": 45}
    assert w.stalled(ends, now=6) == ["known"]  # "unknown": no start known, never guessed
    w.start("none", 0)  # nothing committed: it starts at the log's start
    w.start("unknown", 45)  # its committed offset, looked up: at its end
    assert sorted(w.stalled(ends, now=12)) == ["known", "none"]


def test_held_back_partitions_and_other_assignments_are_not_judged():
    w = FetchWatch(stall_s=5)
    w.assigned(["p"], {"p": 0}, now=0)
    w.hold(now=100)  # paused by the consumer itself (back-pressure) until now
    assert w.stalled({"p": 9}, now=104) == []
    assert w.stalled({"p": 9}, now=105) == ["p"]
    w.revoked()
    w.moved("p", 9, now=106)  # a late record of an old assignment
    assert w.quiet(now=200) == [] and w.reached == {}


def test_a_seek_sets_where_the_partition_is_and_counts_as_moving():
    w = FetchWatch(stall_s=5)
    w.assigned(["p"], {"p": 20}, now=0)
    w.moved("p", 30, now=1)
    w.sought("p", 25, now=10)  # read again from 25
    assert w.reached["p"] == 25 and w.quiet(now=14) == []
    assert w.stalled({"p": 30}, now=15) == ["p"]
