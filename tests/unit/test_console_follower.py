"""Where the console's follower starts reading, without a broker: a recording consumer answers the lookups."""

from __future__ import annotations

from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from modpipe.console.follower import Follower
from modpipe.console.index import DecisionIndex

from modpipe.settings import Settings


class LookupConsumer:
    """Answers the watermark and time lookups; records their order."""

    def __init__(self, by_time: dict, ends: dict, fail: bool = False):
        self.by_time, self.ends, self.fail = by_time, ends, fail
        self.calls: list[str] = []

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        self.calls.append("watermarks")
        return 0, self.ends[(tp.topic, tp.partition)]

    def offsets_for_times(self, tps, timeout=None):
        self.calls.append("times")
        if self.fail:
            raise RuntimeError("no time index")
        return [TopicPartition(tp.topic, tp.partition, self.by_time.get((tp.topic, tp.partition), -1)) for tp in tps]


def follower(consumer) -> Follower:
    settings = Settings.from_env({"MODPIPE_PARTITIONS": "2"})
    f = Follower(settings, "127.0.0.1:1", DecisionIndex(100))
    f.consumer.close()
    f.consumer = consumer
    return f


def test_a_partition_with_nothing_recent_starts_at_its_end_taken_before_the_time_lookup():
    # A symbolic end offset would be resolved when the fetcher starts: a decision committed in between was never
    # shown. The end taken before the lookup is a number, and nothing between it and the lookup is missed (a record
    # written there is newer than the lookback, so the lookup would have found it).
    topics = ["posts", "decisions", "labels"]
    ends = {(t, p): 10 * i + p + 5 for i, t in enumerate(topics) for p in range(2)}
    consumer = LookupConsumer(by_time={("decisions", 1): 3}, ends=ends)
    f = follower(consumer)
    f.topics = {t: None for t in topics}
    start = {(tp.topic, tp.partition): tp.offset for tp in f.start_offsets()}
    assert start[("decisions", 1)] == 3  # a record within the lookback: from there
    assert all(offset == ends[key] for key, offset in start.items() if key != ("decisions", 1))
    assert all(offset >= 0 for offset in start.values())  # no symbolic offsets
    assert consumer.calls.index("times") > max(i for i, c in enumerate(consumer.calls) if c == "watermarks")


def test_a_broker_without_a_time_index_is_read_from_the_beginning():
    f = follower(LookupConsumer(by_time={}, ends={(t, p): 4 for t in ("a", "b") for p in range(2)}, fail=True))
    f.topics = {"a": None, "b": None}
    assert {tp.offset for tp in f.start_offsets()} == {OFFSET_BEGINNING}
