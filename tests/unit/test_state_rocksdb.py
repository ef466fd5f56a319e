"""modpipe.streams.state.rocksdb without a broker: a RocksDB table holds a checkpoint's writes in memory until its
transaction commits, then writes them with the changelog position they reach; retention from its time index;
a revoked partition's store is closed and kept; `restore` reads only the tail beyond the store's offset, and
starts over when the record at that offset is not the one the store remembers."""

from __future__ import annotations

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING
from modpipe.streams.state import rocksdb
from modpipe.streams.state.tables import encode_key, encode_value, record_check, restore

from modpipe.settings import Settings
from tests.unit.test_state_tables import Clock, eof, fake_consumer, record  # noqa: F401 - a fixture

CL = "app-features-user-changelog"


def table(tmp_path, retention_ms=0, clock=None, name="user"):
    return rocksdb.RocksTable(name, CL, tmp_path / name, rocksdb.Resources(8 << 20), retention_ms,
                              clock=clock or Clock())


def commit(t, partition, offset, key, value):
    """As the checkpoint does: the changelog record delivered at `offset`, then its transaction committed."""
    t.delivered(partition, offset, encode_key(key), None if value is None else encode_value(value))
    t.committed()


def test_writes_reach_the_store_only_when_their_transaction_commits(tmp_path):
    t = table(tmp_path)
    t.store(0)
    t.set("u1", {"n": 1}, 0)
    assert t.get("u1", 0) == {"n": 1}  # read back before the commit (the next epoch's rounds need it)
    assert t.partitions[0].get(encode_key("u1")) is None and t.partitions[0].offset is None
    commit(t, 0, 41, "u1", {"n": 1})
    assert t.partitions[0].get(encode_key("u1"))[0] == encode_value({"n": 1})
    assert t.partitions[0].offset == 41 and t.partitions[0].meta["check"] == record_check(
        encode_key("u1"), encode_value({"n": 1}))
    assert t.keys() == 1 and t.size_bytes == len(encode_value({"n": 1}))
    t.set("u1", {"n": 2}, 0)
    t.set("u2", {"n": 3}, 0)
    t.drop(0)  # revoked before the commit (a crash): the staged writes are gone, the store is kept
    t.store(0)
    assert t.get("u1", 0) == {"n": 1} and t.get("u2", 0) is None and t.partitions[0].offset == 41
    assert t.decoded() == {0: {"u1": {"n": 1}}}


def test_a_store_survives_its_table_and_keeps_its_count(tmp_path):
    t = table(tmp_path)
    t.store(3)
    for i in range(10):
        t.set(f"u{i}", {"n": i}, 3)
    commit(t, 3, 9, "u9", {"n": 9})
    t.set("u0", None and {} or {"n": 100}, 3)
    commit(t, 3, 11, "u0", {"n": 100})
    t.close()
    again = table(tmp_path)
    assert again.restore_begin(3) == (11, record_check(encode_key("u0"), encode_value({"n": 100})))
    assert again.keys() == 0  # a store being restored is installed only by restore_end
    again.restore_end(3)
    assert again.keys() == 10 and again.get("u0", 3) == {"n": 100} and again.get("u5", 3) == {"n": 5}


def test_retention_forgets_the_oldest_keys_through_tombstones_and_a_write_makes_a_key_young(tmp_path):
    clock = Clock()
    t = table(tmp_path, retention_ms=1_000, clock=clock, name="post")
    t.store(0)
    t.store(1)
    t.set("a", {"n": 1}, 0)
    clock.now += 400
    t.set("b", {"n": 2}, 0)
    t.set("c", {"n": 3}, 1)
    commit(t, 0, 5, "b", {"n": 2})
    clock.now += 400
    t.set("a", {"n": 4}, 0)
    t.committed()
    clock.now += 599
    assert not t.expiry_due() and t.expired() == []
    clock.now += 1
    assert t.expiry_due()
    t.set("c", {"n": 5}, 1)  # written again in this checkpoint: young, not forgotten
    assert t.expired() == [(0, "b")]
    assert t.get("b", 0) is None  # forgotten at once for this worker's reads
    t.committed()
    assert not t.expiry_due() and t.decoded() == {0: {"a": {"n": 4}}, 1: {"c": {"n": 5}}}
    assert t.keys() == 2


def test_restore_reads_only_what_the_store_does_not_hold(tmp_path, fake_consumer):  # noqa: F811
    t = table(tmp_path)
    t.store(1)
    t.set("u1", {"n": 1}, 1)
    commit(t, 1, 3, "u1", {"n": 1})
    t.drop(1)
    fake_consumer.script = [
        [record(CL, 1, "u1", {"n": 1}, offset=3)],  # first the store's own last record
        [record(CL, 1, "u2", {"n": 2}, offset=5), record(CL, 1, "u1", None, offset=6), eof(CL, 1)],  # the tail
    ]
    assert restore([t], [1], Settings.from_env({}), "b") == 2
    [consumer] = fake_consumer.made
    assert consumer.assigned == [(CL, 1, 3)]
    assert t.decoded() == {1: {"u2": {"n": 2}}} and t.partitions[1].offset == 6


@pytest.mark.parametrize("found", ["another record", "nothing"])
def test_a_store_whose_last_record_is_not_in_the_changelog_is_restored_from_the_start(tmp_path, fake_consumer,  # noqa: F811
                                                                                       found):
    """A store ahead of the committed changelog (its transaction lost, the changelog recreated): the record at
    its offset is another one, or none (aborted, beyond the end). It is wiped and read from the start."""
    t = table(tmp_path)
    t.store(0)
    t.set("ghost", {"n": 9}, 0)
    commit(t, 0, 7, "ghost", {"n": 9})
    t.drop(0)
    changelog = [record(CL, 0, "u1", {"n": 1}, offset=0)]
    if found == "another record":
        changelog.append(record(CL, 0, "other", {"n": 2}, offset=7))
    at7 = changelog[1:]  # the check reads at 7 (beyond the end when nothing is there), then from the start
    fake_consumer.script = [at7, [*changelog, eof(CL, 0)]]
    assert restore([t], [0], Settings.from_env({}), "b") == len(changelog)
    assert fake_consumer.made[-1].assigned == [(CL, 0, OFFSET_BEGINNING)]
    assert t.decoded() == {0: {orjson.loads(m.key()): orjson.loads(m.value()) for m in changelog}}
    assert t.partitions[0].offset == changelog[-1].offset()


def test_a_store_restored_from_scratch_keeps_the_record_ages(tmp_path, fake_consumer):  # noqa: F811
    clock = Clock(now=96_000)
    t = table(tmp_path, retention_ms=10_000, clock=clock, name="post")
    fake_consumer.script = [[record(CL, 0, "old", {"n": 1}, at_ms=85_000, offset=0),
                             record(CL, 0, "new", {"n": 2}, at_ms=87_000, offset=1),
                             record(CL, 0, "old", {"n": 4}, at_ms=90_000, offset=2), eof(CL, 0)]]
    assert restore([t], [0], Settings.from_env({}), "b") == 3
    assert t.expired() == [] and t.keys() == 2
    clock.now = 97_000
    assert t.expired() == [(0, "new")]
    t.committed()
    assert t.keys() == 1 and orjson.loads(t.partitions[0].get(encode_key("old"))[0]) == {"n": 4}


def test_the_oldest_keys_answered_from_the_floor_are_those_a_scan_finds(tmp_path):
    """`oldest` skips its iterator while the cutoff lies below the store's floor (at or below its oldest row):
    through random writes, rewrites, deletions and cutoffs it answers what a full scan of the time index does."""
    import random

    rng = random.Random(7)
    store = rocksdb.PartitionStore(tmp_path / "p", rocksdb.Resources(8 << 20))
    skipped = 0
    for _ in range(400):
        rows = {}
        for _ in range(rng.randrange(1, 4)):
            key = encode_key(f"k{rng.randrange(30)}")
            rows[key] = None if rng.random() < 0.2 else (b"{}", rng.randrange(0, 10_000))
        store.write(rows, None, 0)
        cutoff = rng.randrange(0, 10_000)
        floor = store.floor_ms
        answer = store.oldest(before_ms=cutoff)
        skipped += floor is not None and cutoff < floor
        store.floor_ms = None  # the reference: a scan from the first row
        assert answer == store.oldest(before_ms=cutoff)
    assert skipped > 10  # the floor did answer, not only the scans
    store.close()


def test_a_checkpoint_writes_only_the_stores_of_partitions_it_changed(tmp_path, monkeypatch):
    clock = Clock()
    t = table(tmp_path, retention_ms=1_000, clock=clock, name="post")
    for p in range(4):
        t.store(p)
    writes = []
    monkeypatch.setattr(rocksdb.PartitionStore, "write",
                        lambda self, rows, offset, check: writes.append(self.path.name))
    t.set("a", {"n": 1}, 2)
    commit(t, 2, 7, "a", {"n": 1})
    assert writes == ["2"]
    writes.clear()
    assert t.expired() == []  # nothing due: no partition is touched
    t.committed()
    assert writes == []


def test_a_store_being_restored_is_out_of_the_table_until_installed_and_closed_when_called_off(
        tmp_path, fake_consumer):  # noqa: F811
    """A restore on another thread must not add to `partitions` while the loop iterates it (expiry, gauges):
    the store is installed by `restore_end`; one called off is closed, and what it wrote is a prefix of the
    changelog that the next restore checks and continues."""
    t = table(tmp_path)
    t.store(0)
    fake_consumer.script = [[record(CL, 1, "u1", {"n": 1}, offset=0), eof(CL, 1)]]
    assert restore([t], [1], Settings.from_env({}), "b", install=False) == 1
    assert sorted(t.partitions) == [0]
    t.restore_end(1)
    assert t.decoded() == {0: {}, 1: {"u1": {"n": 1}}}
    t.drop(1)
    t.restore_begin(1)
    t.restore_abandon(1)
    assert sorted(t.partitions) == [0]
    assert t.restore_begin(1) == (0, record_check(encode_key("u1"), encode_value({"n": 1})))  # reopened: not locked
