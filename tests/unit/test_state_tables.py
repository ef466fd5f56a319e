"""modpipe.streams.state.tables without a broker: changelog naming and record encoding, the in-memory table partitions and their
retention, and `restore` against a fake confluent-kafka Consumer (committed changelog records replace the
partitions, each key with its record's timestamp)."""

from __future__ import annotations

import collections

import orjson
import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from modpipe.features.events import TABLES
from modpipe.streams.state import tables
from modpipe.streams.state.tables import (
    Table,
    changelog_topic,
    encode_key,
    encode_value,
    make_tables,
    restore,
)

from modpipe.settings import Settings


def test_changelog_names_and_records_are_what_the_readers_expect():
    assert changelog_topic("modpipe", "user") == "modpipe-features-user-changelog"
    assert encode_key("u1") == b'"u1"' and orjson.loads(encode_key("caf\u00e9")) == "caf\u00e9"
    value = {"posts": {"n": 2, "ids": ["p1", "p2"]}, "hwm": None}
    assert orjson.loads(encode_value(value)) == value


def test_an_encoded_state_or_key_costs_its_length_not_orjsons_write_buffer():
    """A RocksDB table holds them until the commit, a changelog record until its delivery, an in-memory table
    for good: orjson's own result keeps ~32 KB for a 3 KB state and 4 KB for a key."""
    import tracemalloc

    states = [{"n": i, "recent": [[i, "x" * 3000]]} for i in range(100)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = [(encode_key(f"u{i}"), encode_value(v)) for i, v in enumerate(states)]
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert held < sum(len(k) + len(v) + 150 for k, v in kept) + 2_000, held


def test_make_tables_gives_every_feature_table_its_changelog():
    made = make_tables("app")
    assert set(made) == set(TABLES)
    assert all(t.name == name and t.changelog == changelog_topic("app", name) for name, t in made.items())


def test_a_table_keeps_each_partitions_keys_apart():
    t = Table("user", "c")
    assert t.set("u1", {"n": 1}, 0) == encode_value({"n": 1})  # the changelog record's value
    t.set("u1", {"n": 5}, 3)
    t.set("u2", {"n": 2}, 3)
    assert t.get("u1", 0) == {"n": 1} and t.get("u1", 3) == {"n": 5} and t.get("u2", 0) is None
    assert t.get("u1", 7) is None and t.keys() == 3
    t.drop(3)
    t.drop(9)  # not held: nothing happens
    assert t.decoded() == {0: {"u1": {"n": 1}}} and t.keys() == 1
    assert t.size_bytes == len(encode_value({"n": 1}))


class Clock:
    def __init__(self, now: int = 1_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_a_key_not_written_for_the_retention_is_forgotten_and_a_write_makes_it_young():
    clock = Clock()
    t = Table("post", "c", retention_ms=1_000, clock=clock)
    t.set("a", {"n": 1}, 0)
    clock.now += 400
    t.set("b", {"n": 2}, 0)
    t.set("c", {"n": 3}, 1)
    clock.now += 400
    t.set("a", {"n": 4}, 0)  # written again: the newest of its partition now
    clock.now += 599
    assert not t.expiry_due() and t.expired() == []  # b and c are 999 ms old, a 599 ms (the first write of a is not what counts)
    clock.now += 1
    assert t.expiry_due() and sorted(t.expired()) == [(0, "b"), (1, "c")]
    assert not t.expiry_due()  # written exactly the retention ago
    assert t.decoded() == {0: {"a": {"n": 4}}, 1: {}} and t.size_bytes == len(encode_value({"n": 4}))
    clock.now += 400
    assert t.expired() == [(0, "a")] and t.keys() == 0 and t.size_bytes == 0


def test_without_a_retention_nothing_is_forgotten():
    clock = Clock()
    t = Table("user", "c", clock=clock)
    t.set("u", {"n": 1}, 0)
    clock.now += 10**12
    assert not t.expiry_due() and t.expired() == [] and t.keys() == 1


def test_make_tables_gives_each_table_its_retention():
    made = make_tables("app", {"post": 5_000, "user": 0})
    assert made["post"].retention_ms == 5_000 and made["user"].retention_ms == 0 and made["ip"].retention_ms == 0


class FakeError:
    def __init__(self, code, fatal=False):
        self._code, self._fatal = code, fatal

    def code(self):
        return self._code

    def fatal(self):
        return self._fatal

    def retriable(self):
        return False


class FakeMessage:
    def __init__(self, topic, partition, key=None, value=None, error=None, timestamp=(TIMESTAMP_CREATE_TIME, 5),
                 offset=0):
        self._t, self._p, self._k, self._v, self._e = topic, partition, key, value, error
        self._ts, self._o = timestamp, offset

    def offset(self):
        return self._o

    def timestamp(self):
        return self._ts

    def topic(self):
        return self._t

    def partition(self):
        return self._p

    def key(self):
        return self._k

    def value(self):
        return self._v

    def error(self):
        return self._e


def eof(topic, partition):
    return FakeMessage(topic, partition, error=FakeError(KafkaError._PARTITION_EOF))


def record(topic, partition, key, value, at_ms=5, offset=0):
    return FakeMessage(topic, partition, encode_key(key), None if value is None else encode_value(value),
                       timestamp=(TIMESTAMP_CREATE_TIME, at_ms), offset=offset)


@pytest.fixture
def fake_consumer(monkeypatch):
    class FakeConsumer:
        made: list = []

        def __init__(self, conf):
            self.conf = conf
            if not FakeConsumer.made:  # one script for every consumer a restore makes, in order
                FakeConsumer.whole = list(FakeConsumer.script)
                FakeConsumer.queue = collections.deque(FakeConsumer.script)
            self.script = FakeConsumer.queue
            self.assigned = None
            self.closed = False
            FakeConsumer.made.append(self)

        def assign(self, tps):
            self.assigned = [(tp.topic, tp.partition, tp.offset) for tp in tps]
            self.read: collections.Counter = collections.Counter()  # records handed out, per partition
            self.next: dict = {}  # the offset after the last record handed out, per partition

        def get_watermark_offsets(self, tp, timeout=None, cached=False):
            """(0, records the script holds for the partition, plus `unseen` of them): one offset per record,
            as without markers; a partition the script says is missing raises, as the broker's answer does."""
            msgs = [m for batch in FakeConsumer.whole for m in batch if (m.topic(), m.partition()) == (tp.topic, tp.partition)]
            missing = [m.error() for m in msgs if m.error() is not None and m.error().code() == KafkaError.UNKNOWN_TOPIC_OR_PART]
            if missing:
                raise KafkaException(missing[0])
            records = [m for m in msgs if m.error() is None]
            high = max([len(records), *(m.offset() + 1 for m in records)])
            return 0, high + FakeConsumer.unseen.get((tp.topic, tp.partition), 0)

        def position(self, tps):
            return [TopicPartition(tp.topic, tp.partition, max(self.read[(tp.topic, tp.partition)],
                                                               self.next.get((tp.topic, tp.partition), 0)))
                    for tp in tps]

        def consume(self, n, timeout):
            batch = self.script.popleft() if self.script else []
            self.read.update((m.topic(), m.partition()) for m in batch if m.error() is None)
            for m in batch:
                if m.error() is None:
                    self.next[(m.topic(), m.partition())] = m.offset() + 1
            return batch

        def pause(self, tps):
            pass

        def close(self):
            self.closed = True

    FakeConsumer.script = []
    FakeConsumer.unseen = {}
    monkeypatch.setattr(tables, "Consumer", FakeConsumer)
    return FakeConsumer


def test_restore_replaces_the_partitions_with_what_their_changelogs_hold(fake_consumer):
    user, url = Table("user", "app-features-user-changelog"), Table("url", "app-features-url-changelog")
    user.set("stale", {"n": 99}, 1)  # partition 1 is restored: what was there goes
    user.set("kept", {"n": 7}, 2)  # partition 2 is not: untouched
    uc, lc = user.changelog, url.changelog
    fake_consumer.script = [
        [record(uc, 1, "u1", {"n": 1}), record(uc, 1, "u2", {"n": 2}), record(lc, 1, "x", {"n": 3})],
        [record(uc, 1, "u1", {"n": 4}), record(uc, 1, "u2", None),  # a newer state, a tombstone
         FakeMessage(uc, 1, error=FakeError(KafkaError._TRANSPORT)), eof(uc, 1), eof(lc, 1)],
        [eof(uc, 3), eof(lc, 3)],  # partition 3's changelogs are empty
    ]
    n = restore([user, url], [1, 3], Settings.from_env({}), "b:9092")
    assert n == 5
    assert user.decoded() == {1: {"u1": {"n": 4}}, 2: {"kept": {"n": 7}}, 3: {}}
    assert url.decoded() == {1: {"x": {"n": 3}}, 3: {}}

    assert user.size_bytes == len(encode_value({"n": 4})) + len(encode_value({"n": 7}))
    [consumer] = fake_consumer.made
    assert consumer.conf["isolation.level"] == "read_committed" and consumer.conf["enable.partition.eof"] is True
    assert consumer.conf["bootstrap.servers"] == "b:9092" and consumer.conf["enable.auto.commit"] is False
    assert sorted(consumer.assigned) == sorted((t, p, OFFSET_BEGINNING) for t in (uc, lc) for p in (1, 3))
    assert consumer.closed


def test_nothing_to_restore_reads_nothing(fake_consumer):
    assert restore([], [1], Settings.from_env({}), "b") == 0
    assert restore([Table("user", "c")], [], Settings.from_env({}), "b") == 0
    assert fake_consumer.made == []


def test_a_missing_changelog_fails_the_restore_and_leaves_the_table_alone(fake_consumer):
    user = Table("user", "c")
    user.set("u", {"n": 1}, 0)
    fake_consumer.script = [[FakeMessage("c", 0, error=FakeError(KafkaError.UNKNOWN_TOPIC_OR_PART))]]
    with pytest.raises(KafkaException):
        restore([user], [0], Settings.from_env({}), "b")
    assert user.decoded() == {0: {"u": {"n": 1}}} and fake_consumer.made[0].closed


def test_a_changelog_not_read_to_its_end_in_time_fails_the_restore(fake_consumer):
    user = Table("user", "c")
    fake_consumer.script = [[record("c", 0, "u", {"n": 1})]]  # then nothing, never the end
    fake_consumer.unseen = {("c", 0): 1}
    with pytest.raises(TimeoutError):
        restore([user], [0], Settings.from_env({}), "b", timeout_s=0.05)
    assert user.decoded() == {} and fake_consumer.made[0].closed


def test_a_restored_key_keeps_the_age_of_its_last_record(fake_consumer):
    """A restart must not make every key young again: each restored key is as old as its last changelog record
    (a record without a timestamp counts from the restore)."""
    clock = Clock(now=96_000)
    post = Table("post", "c", retention_ms=10_000, clock=clock)
    fake_consumer.script = [[record("c", 0, "old", {"n": 1}, at_ms=85_000), record("c", 0, "new", {"n": 2}, at_ms=87_000),
                             record("c", 0, "rewritten", {"n": 3}, at_ms=88_000),
                             record("c", 0, "old", {"n": 4}, at_ms=90_000),  # written again: moves to the end
                             FakeMessage("c", 0, encode_key("no-ts"), encode_value({"n": 5}),
                                         timestamp=(TIMESTAMP_NOT_AVAILABLE, -1)),
                             record("c", 0, "rewritten", None, at_ms=91_000),  # a tombstone: gone
                             eof("c", 0)]]
    restore([post], [0], Settings.from_env({}), "b")
    assert list(post.decoded()[0]) == ["new", "old", "no-ts"]  # the order of their last writes
    assert post.expired() == []  # "new" is 9 s old; "old" 11 s by its first record, 6 s by its last
    clock.now = 97_000
    assert post.expired() == [(0, "new")]
    clock.now = 100_000
    assert post.expired() == [(0, "old")]
    clock.now = 96_000 + 10_000  # "no-ts" counts from the restore
    assert post.expired() == [(0, "no-ts")] and post.keys() == 0


def test_a_restore_reads_past_an_end_of_partition_to_the_high_watermark(fake_consumer):
    """Under read_committed librdkafka reports the end of a partition at its last stable offset: a transaction
    its producer committed, whose marker is not in the changelog yet, lies beyond it. The restore reads on to
    the high watermark it found at its start, so the previous owner's last states are not lost."""
    user = Table("user", "app-features-user-changelog")
    uc = user.changelog
    fake_consumer.script = [
        [record(uc, 0, "u1", {"n": 1}), eof(uc, 0)],  # the end as the last stable offset stood
        [],  # the marker is written meanwhile
        [record(uc, 0, "u1", {"n": 2}), record(uc, 0, "u2", {"n": 1}), eof(uc, 0)],  # the committed rest
    ]
    assert restore([user], [0], Settings.from_env({}), "b:9092") == 3
    assert user.decoded() == {0: {"u1": {"n": 2}, "u2": {"n": 1}}}


def test_a_restore_reads_to_exactly_the_committed_end(fake_consumer):
    """With the end committed beside the offsets the worker starts from (streams/state/ends.py), the restore reads
    past an end-of-partition that comes early (the last stable offset, held below the end by a transaction open
    below the committed records, or by markers not written yet) and applies nothing at or past the end."""
    user = Table("user", "app-features-user-changelog")
    uc = user.changelog
    fake_consumer.script = [
        [record(uc, 0, "u1", {"n": 1}, offset=0), record(uc, 0, "u2", {"n": 1}, offset=1),
         FakeMessage(uc, 0, error=FakeError(KafkaError._PARTITION_EOF), offset=2)],  # the last stable offset
        [],  # the open transaction ends meanwhile
        [record(uc, 0, "u1", {"n": 2}, offset=4), record(uc, 0, "u3", {"n": 1}, offset=5),
         record(uc, 0, "later", {"n": 9}, offset=6)],  # offset 6: not in the committed checkpoint
    ]
    reached: dict = {}
    assert restore([user], [0], Settings.from_env({}), "b:9092", ends={(uc, 0): 6}, reached=reached) == 4
    assert user.decoded() == {0: {"u1": {"n": 2}, "u2": {"n": 1}, "u3": {"n": 1}}}
    assert reached == {(uc, 0): 6}


def test_a_committed_end_reached_by_an_end_of_partition_event_ends_the_read(fake_consumer):
    user = Table("user", "c")
    fake_consumer.script = [[record("c", 0, "u1", {"n": 1}, offset=0),
                             FakeMessage("c", 0, error=FakeError(KafkaError._PARTITION_EOF), offset=3)]]
    fake_consumer.unseen = {("c", 0): 5}  # what a read to the partition's end would wait for
    assert restore([user], [0], Settings.from_env({}), "b", timeout_s=5, ends={("c", 0): 2}) == 1


def test_a_committed_end_of_zero_reads_nothing(fake_consumer):
    user = Table("user", "c")
    user.set("stale", {"n": 1}, 0)
    fake_consumer.script = [[record("c", 0, "u1", {"n": 1}, offset=0)]]
    reached: dict = {}
    assert restore([user], [0], Settings.from_env({}), "b", ends={("c", 0): 0}, reached=reached) == 0
    assert user.decoded() == {0: {}} and reached == {("c", 0): 0}


def test_without_a_committed_end_the_restore_reads_to_the_end_it_is_told_and_says_where(fake_consumer):
    user = Table("user", "c")
    fake_consumer.script = [[record("c", 0, "u1", {"n": 1}, offset=0), record("c", 0, "u2", {"n": 1}, offset=1),
                             eof("c", 0)]]
    reached: dict = {}
    assert restore([user], [0], Settings.from_env({}), "b", reached=reached) == 2
    assert reached == {("c", 0): 2}


def test_a_restore_held_below_its_committed_end_says_why_and_gives_up_after_its_timeout(fake_consumer, monkeypatch,
                                                                                      caplog):
    monkeypatch.setattr(tables, "RESTORE_PROGRESS_S", 0.02)
    user = Table("user", "c")
    fake_consumer.script = [[record("c", 0, "u1", {"n": 1}, offset=0),
                             FakeMessage("c", 0, error=FakeError(KafkaError._PARTITION_EOF), offset=1)]]
    fake_consumer.unseen = {("c", 0): 5}  # the records past the last stable offset: the log reaches the end
    with caplog.at_level("WARNING", logger="modpipe.streams.state.tables"), pytest.raises(TimeoutError):
        restore([user], [0], Settings.from_env({}), "b", timeout_s=0.3, ends={("c", 0): 4})
    reports = [r for r in caplog.records if r.getMessage().startswith("changelog restore still reading")]
    assert reports and "transaction still open below them" in reports[-1].getMessage()
    assert reports[-1].behind[0]["end"] == 4 and reports[-1].behind[0]["position"] == 1
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert user.decoded() == {}  # nothing of a restore that did not reach its end


def test_a_changelog_that_ends_below_its_committed_end_is_reported_as_lost(fake_consumer, monkeypatch, caplog):
    monkeypatch.setattr(tables, "RESTORE_PROGRESS_S", 0.02)
    user = Table("user", "c")
    fake_consumer.script = [[record("c", 0, "u1", {"n": 1}, offset=0)]]  # the log holds one record
    with caplog.at_level("WARNING", logger="modpipe.streams.state.tables"), pytest.raises(TimeoutError):
        restore([user], [0], Settings.from_env({}), "b", timeout_s=0.2, ends={("c", 0): 4})
    assert any(r.levelname == "ERROR" and "committed states are gone" in r.getMessage() for r in caplog.records)


def test_a_restore_without_install_leaves_the_table_as_it_was_until_restore_end(fake_consumer):
    """The runner restores off its loop while other partitions are worked on: the table it reads into is not
    changed (expiry and the gauges iterate its partitions) until `restore_end` installs the partition."""
    user = Table("user", "c")
    user.set("kept", {"n": 7}, 2)
    fake_consumer.script = [[record("c", 1, "u1", {"n": 1}, offset=0), eof("c", 1)]]
    assert restore([user], [1], Settings.from_env({}), "b", install=False) == 1
    assert user.decoded() == {2: {"kept": {"n": 7}}}
    user.restore_end(1)
    assert user.decoded() == {1: {"u1": {"n": 1}}, 2: {"kept": {"n": 7}}}


def test_a_restore_called_off_stops_reading_and_leaves_nothing_behind(fake_consumer):
    user = Table("user", "c")
    user.set("kept", {"n": 7}, 2)
    fake_consumer.script = [[record("c", 1, "u1", {"n": 1}, offset=0)]]
    fake_consumer.unseen = {("c", 1): 5}  # a committed end not handed out yet: the read would wait
    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(tables.RestoreCancelled):
        restore([user], [1], Settings.from_env({}), "b", timeout_s=30, ends={("c", 1): 4}, install=False,
                cancelled=cancelled)
    assert user.decoded() == {2: {"kept": {"n": 7}}} and user._restoring == {}
    assert fake_consumer.made[0].closed
