"""resume_now: a resume wakes librdkafka's fetcher with one request to the broker, after a seek of each partition
whose consumed position is not the offset it must fetch next. fetch_window and paced_fetches: a fetch window ends once every partition it expects has
answered (records or an end-of-partition event), and a reader pauses its partitions between windows."""

import threading

from confluent_kafka import KafkaError, TopicPartition

from modpipe.services.fetching import BACKLOG_RECORDS, FETCH_WAIT_S, fetch_window, paced_fetches, resume_now
from tests.unit.test_kafka_consumer import FakeError, FakeMessage


class FakeConsumer:
    def __init__(self, lows=None, positions=None):
        self.calls: list = []
        self.lows = lows or {}
        self.positions = positions or {}  # (topic, partition) -> consumed position; others -1001 (none)

    def get_watermark_offsets(self, tp, timeout=None, cached=False):
        self.calls.append(("watermarks", (tp.topic, tp.partition), cached))
        return self.lows.get((tp.topic, tp.partition), 0), 100

    def resume(self, tps):
        self.calls.append(("resume", [(tp.topic, tp.partition) for tp in tps]))

    def seek(self, tp):
        self.calls.append(("seek", (tp.topic, tp.partition, tp.offset)))

    def position(self, tps):
        return [TopicPartition(tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001))
                for tp in tps]


def test_resume_then_seek_each_partition_to_its_next_offset_only_where_known():
    c = FakeConsumer()
    tps = [TopicPartition("posts", 0), TopicPartition("posts", 1), TopicPartition("decisions", 3)]
    resume_now(c, tps, {("posts", 0): 17, ("decisions", 3): 4, ("posts", 9): 1})
    assert c.calls[0] == ("resume", [("posts", 0), ("posts", 1), ("decisions", 3)])  # resumed before any seek
    assert c.calls[1:3] == [("seek", ("posts", 0, 17)), ("seek", ("decisions", 3, 4))]  # posts[1]: nothing read yet
    assert c.calls[3:] == [("watermarks", ("posts", 0), False)]  # one request to the broker, after the seeks


def test_a_partition_already_at_its_next_offset_is_not_sought():
    """A pause makes the consumed position the next fetch: a seek there is a broker-thread op for nothing. A
    partition the caller sought back (its position not yet there) is sought again, or the resume would undo it."""
    c = FakeConsumer(positions={("posts", 0): 17, ("posts", 1): 9, ("decisions", 3): 4})
    tps = [TopicPartition("posts", 0), TopicPartition("posts", 1), TopicPartition("decisions", 3)]
    resume_now(c, tps, {("posts", 0): 17, ("posts", 1): 5, ("decisions", 3): 4}, sought={("posts", 1)})
    assert [x for x in c.calls if x[0] == "seek"] == [("seek", ("posts", 1, 5))]
    assert c.calls[-1] == ("watermarks", ("posts", 0), False)


def test_a_position_past_a_marker_is_taken_not_sought_back_to():
    """Ahead of the last record + 1 without a seek of the caller's own: a commit marker or aborted records,
    which read_committed never delivers. Seeking back would only skip them again, at every resume. Behind it,
    the position is not where the caller left off: sought, as always."""
    c = FakeConsumer(positions={("decisions", 0): 9, ("decisions", 1): 2})
    tps = [TopicPartition("decisions", 0), TopicPartition("decisions", 1)]
    next_offsets = {("decisions", 0): 8, ("decisions", 1): 5}
    resume_now(c, tps, next_offsets)
    assert [x for x in c.calls if x[0] == "seek"] == [("seek", ("decisions", 1, 5))]
    assert next_offsets == {("decisions", 0): 9, ("decisions", 1): 5}


def test_nothing_to_resume_sends_nothing():
    c = FakeConsumer()
    resume_now(c, [], {})
    assert c.calls == []



class ScriptedConsumer(FakeConsumer):
    """consume() answers from a script of message lists (then nothing); records each call's arguments."""

    def __init__(self, script, assigned=(("decisions", 0),)):
        super().__init__()
        self.script = list(script)
        self.assigned = [TopicPartition(t, p) for t, p in assigned]

    def consume(self, n, timeout):
        self.calls.append(("consume", n, timeout))
        batch = self.script.pop(0) if self.script else []
        return batch[:n]

    def assignment(self):
        return list(self.assigned)

    def pause(self, tps):
        self.calls.append(("pause", [(tp.topic, tp.partition) for tp in tps]))


def eof(topic, partition, offset):
    return FakeMessage(topic, partition, offset, error=FakeError(KafkaError._PARTITION_EOF))


def test_a_fetch_window_waits_for_the_first_message_then_takes_what_is_queued_without_waiting():
    c = ScriptedConsumer([[FakeMessage("posts", 0, 1)], [FakeMessage("posts", 0, 2), FakeMessage("posts", 1, 7)]])
    got = fetch_window(c, 500, 0.01)
    assert [m.offset() for m in got] == [1, 2, 7]
    assert [x for x in c.calls if x[0] == "consume"] == [("consume", 1, 0.01), ("consume", 499, 0)]


def test_an_empty_fetch_window_asks_once():
    c = ScriptedConsumer([])
    assert fetch_window(c, 500, 0.01) == []
    assert c.calls == [("consume", 1, 0.01)]


def test_a_fetch_window_ends_once_every_expected_partition_has_answered():
    expect = [("posts", 0), ("posts", 1), ("reports", 0)]
    # the answer is queued in three parts: an end of partition, then records, then the last end of partition
    c = ScriptedConsumer([[eof("posts", 0, 3)], [], [FakeMessage("posts", 1, 7)], [FakeMessage("posts", 1, 8)],
                          [eof("reports", 0, 1)], [], [FakeMessage("posts", 0, 3)]])
    got = fetch_window(c, 500, 0.5, expect=expect, clock=lambda: 0.0)
    assert [(m.partition(), m.offset()) for m in got if m.error() is None] == [(1, 7), (1, 8)]
    assert len(got) == 4  # the record queued after the last answer is left for the next window
    waits = [x for x in c.calls if x[0] == "consume" and x[1] == 1]
    assert waits == [("consume", 1, 0.5)] * 3  # each wait for the next part is bounded by the window's deadline


def test_a_fetch_window_gives_up_on_an_unanswered_partition_at_its_timeout():
    c = ScriptedConsumer([[eof("posts", 0, 3)], [], [FakeMessage("posts", 1, 1)]])
    times = iter([0.0, 0.004])  # the deadline is 0.01: 6 ms are left for the wait
    got = fetch_window(c, 500, 0.01, expect=[("posts", 0), ("posts", 1)], clock=lambda: next(times))
    assert [m.offset() for m in got] == [3, 1]
    assert [x for x in c.calls if x[0] == "consume" and x[1] == 1][1][2] == 0.01 - 0.004
    c = ScriptedConsumer([[eof("posts", 0, 3)], [], [FakeMessage("posts", 1, 1)]])
    times = iter([0.0, 0.02])  # past the deadline: no further wait
    got = fetch_window(c, 500, 0.01, expect=[("posts", 0), ("posts", 1)], clock=lambda: next(times))
    assert [m.offset() for m in got] == [3] and len([x for x in c.calls if x[0] == "consume"]) == 2
    c = ScriptedConsumer([[eof("posts", 0, 3)]])  # nothing more comes: the wait ends empty
    got = fetch_window(c, 500, 0.01, expect=[("posts", 0), ("posts", 1)], clock=lambda: 0.0)
    assert len(got) == 1 and len([x for x in c.calls if x[0] == "consume"]) == 3


def test_a_fetch_window_stops_at_its_size_limit():
    c = ScriptedConsumer([[FakeMessage("posts", 1, 7)], [FakeMessage("posts", 1, 8)], [eof("posts", 0, 1)]])
    got = fetch_window(c, 2, 0.5, expect=[("posts", 0), ("posts", 1)])
    assert [m.offset() for m in got] == [7, 8]


def test_a_reader_pauses_between_windows_and_resumes_from_the_next_offsets():
    stop = threading.Event()
    c = ScriptedConsumer([[FakeMessage("decisions", 0, 5)], [eof("decisions", 0, 6)], []])
    clock = iter([0.0, 10.0, 10.0, 10.0, 10.0])  # the grace period is over after the first window
    nxt = {("decisions", 0): 5}
    windows = []
    for messages in paced_fetches(c, stop, 0.001, next_offsets=nxt, grace_s=2.0, clock=lambda: next(clock)):
        windows.append([m.offset() for m in messages])
        if len(windows) == 3:
            stop.set()
    assert windows == [[5], [], []]  # an error (end of partition) is not handed on
    assert nxt == {("decisions", 0): 6}
    kinds = [x[0] for x in c.calls]
    # one window (first message, then the rest), pause, resume + seek + wake-up request, next window
    assert kinds[:7] == ["consume", "consume", "pause", "resume", "seek", "watermarks", "consume"]
    assert ("seek", ("decisions", 0, 6)) in c.calls
    assert ("consume", 1, FETCH_WAIT_S) in c.calls


def test_a_reader_does_not_pause_in_its_grace_period_or_with_no_pause_set():
    for pause_s, clock_at in ((0.001, 0.5), (0.0, 10.0)):
        stop = threading.Event()
        c = ScriptedConsumer([[FakeMessage("decisions", 0, 5)], [], [FakeMessage("decisions", 0, 6)]])
        seen = []
        for messages in paced_fetches(c, stop, pause_s, clock=lambda t=clock_at: t):
            seen += [m.offset() for m in messages]
            if len([x for x in c.calls if x == ("consume", 1, FETCH_WAIT_S)]) == 3:
                stop.set()
        assert seen == [5, 6] and not [x for x in c.calls if x[0] in ("pause", "resume")]


def test_a_reader_fetches_on_at_once_after_a_backlog():
    stop = threading.Event()
    backlog = [FakeMessage("decisions", 0, n) for n in range(BACKLOG_RECORDS)]
    c = ScriptedConsumer([backlog[:1], backlog[1:], [FakeMessage("decisions", 0, BACKLOG_RECORDS)], []])
    windows = []
    for messages in paced_fetches(c, stop, 0.001, clock=lambda: 10.0, grace_s=0.0):
        windows.append(len(messages))
        if len(windows) == 2:
            stop.set()
    assert windows == [BACKLOG_RECORDS, 1]
    kinds = [x[0] for x in c.calls]
    assert kinds[:3] == ["consume", "consume", "consume"]  # no pause after the backlog's window
