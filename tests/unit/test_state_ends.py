"""modpipe.streams.state.ends: the changelog ends carried in the offset commits' metadata, and a worker's view of
them through a checkpoint."""

from __future__ import annotations

import pytest
from modpipe.features.events import STAGES
from modpipe.streams.state import ends
from modpipe.streams.state.ends import ChangelogEnds


def test_ends_go_through_the_metadata_unchanged():
    text = ends.encode({"url": 12, "domain": 0})
    assert text.startswith(ends.PREFIX)
    assert ends.decode(text) == {"url": 12, "domain": 0}


def test_every_stage_s_ends_fit_kafka_s_default_metadata_limit_with_room_to_spare():
    """Apache Kafka refuses a longer string (OFFSET_METADATA_TOO_LARGE: the commit fails)."""
    for tables in STAGES.values():
        assert len(ends.encode({t: 2**63 - 1 for t in tables}).encode()) < ends.MAX_METADATA_BYTES // 16
    with pytest.raises(ValueError):
        ends.encode({f"t{i}": 2**63 - 1 for i in range(200)})


@pytest.mark.parametrize("metadata", [None, "", "some other tool's note", ends.PREFIX + "{",
                                      ends.PREFIX + '{"user": -1}', ends.PREFIX + '{"user": "3"}',
                                      ends.PREFIX + "[1]"])
def test_metadata_that_holds_no_ends_is_not_taken_for_them(metadata):
    assert ends.decode(metadata) is None


def test_a_checkpoint_s_delivered_records_move_the_ends_only_once_it_commits():
    e = ChangelogEnds()
    e.restored("url", 3, 10)
    e.restored("domain", 3, 4)
    e.delivered("url", 3, 15)
    e.delivered("url", 3, 12)  # reports come in any order: the last record's offset counts
    e.delivered("domain", 5, 0)
    assert e.written() == {("url", 3), ("domain", 5)}
    assert e.of(("url", "domain"), 3) == {"url": 16, "domain": 4}  # what the checkpoint commits
    assert e.committed == {("url", 3): 10, ("domain", 3): 4}
    e.commit()
    assert e.committed == {("url", 3): 16, ("domain", 3): 4, ("domain", 5): 1} and e.written() == set()
    e.forget([3])
    assert e.committed == {("domain", 5): 1} and e.of(("url",), 3) == {}
