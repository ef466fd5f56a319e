"""resume_now: a resume wakes librdkafka's fetcher: a seek to the offset each partition fetches next, then one
request to the broker."""

from confluent_kafka import TopicPartition

from modpipe.services.fetching import resume_now


class FakeConsumer:
    def __init__(self, lows=None):
        self.calls: list = []
        self.lows = lows or {}

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        self.calls.append(("watermarks", (tp.topic, tp.partition), cached))
        return self.lows.get((tp.topic, tp.partition), 0), 100

    def resume(self, tps):
        self.calls.append(("resume", [(tp.topic, tp.partition) for tp in tps]))

    def seek(self, tp):
        self.calls.append(("seek", (tp.topic, tp.partition, tp.offset)))


def test_resume_then_seek_each_partition_to_its_next_offset_only_where_known():
    c = FakeConsumer()
    tps = [TopicPartition("posts", 0), TopicPartition("posts", 1), TopicPartition("decisions", 3)]
    resume_now(c, tps, {("posts", 0): 17, ("decisions", 3): 4, ("posts", 9): 1})
    assert c.calls[0] == ("resume", [("posts", 0), ("posts", 1), ("decisions", 3)])  # resumed before any seek
    assert c.calls[1:3] == [("seek", ("posts", 0, 17)), ("seek", ("decisions", 3, 4))]  # posts[1]: nothing read yet
    assert c.calls[3:] == [("watermarks", ("posts", 0), False)]  # one request to the broker, after the seeks


def test_nothing_to_resume_sends_nothing():
    c = FakeConsumer()
    resume_now(c, [], {})
    assert c.calls == []

