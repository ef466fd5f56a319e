"""RocksDB tables on the real broker: a restore reads only the changelog's tail beyond what a store holds; a store
ahead of the committed changelog (its last record aborted, or beyond the changelog's end) is wiped and restored
from the start; and a worker SIGKILLed mid-stream comes back from its stores plus the tail, its stores equal to
what the changelogs hold."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from modpipe.loadgen.chaos import streaming_tables
from modpipe.loadgen.smoke import end_consumer
from modpipe.streams.moderation.app import tables_dir
from modpipe.streams.state import ends, rocksdb
from modpipe.streams.state import tables as tables_module
from modpipe.streams.state.tables import encode_key, encode_value, record_check, restore

from modpipe.settings import Settings
from tests.fixtures.kafka import create_topics
from tests.integration.test_streaming import collect_decisions, produce_posts

pytestmark = pytest.mark.integration


def write(bootstrap: str, topic: str, rows: dict[str, int | None], commit: bool = True) -> None:
    """One transaction of changelog records (a value of None: a tombstone), committed or aborted."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"t-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for key, n in rows.items():
        producer.produce(topic, None if n is None else encode_value({"n": n}), key=encode_key(key), partition=0)
    assert producer.flush(30) == 0
    (producer.commit_transaction if commit else producer.abort_transaction)(30)


def user_table(root, topic: str) -> rocksdb.RocksTable:
    return rocksdb.RocksTable("user", topic, root, rocksdb.Resources(16 << 20))


@pytest.fixture
def changelog(bootstrap):
    topic = f"t{uuid.uuid4().hex[:8]}-features-user-changelog"
    create_topics(bootstrap, [topic])
    return topic


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings.from_env(state_dir=tmp_path / "state", app_id=f"modpipe-test-{uuid.uuid4().hex[:8]}")


def test_a_restore_reads_only_the_tail_beyond_the_store(bootstrap, changelog, settings, tmp_path):
    write(bootstrap, changelog, {f"u{i}": i for i in range(5)})
    table = user_table(tmp_path / "user", changelog)
    assert restore([table], [0], settings, bootstrap) == 5  # an empty store: the whole changelog
    table.close()
    write(bootstrap, changelog, {"u1": 10, "u2": None, "u5": 5})
    write(bootstrap, changelog, {"u6": 6}, commit=False)  # aborted: never read
    table = user_table(tmp_path / "user", changelog)
    assert restore([table], [0], settings, bootstrap) == 3  # the tail only
    assert table.decoded() == {0: {"u0": {"n": 0}, "u1": {"n": 10}, "u3": {"n": 3}, "u4": {"n": 4}, "u5": {"n": 5}}}
    assert restore([table], [0], settings, bootstrap) == 0  # nothing new


@pytest.mark.parametrize("ahead", ["an aborted record", "beyond the end"])
def test_a_store_ahead_of_the_committed_changelog_is_restored_from_the_start(bootstrap, changelog, settings,
                                                                            tmp_path, ahead):
    """A store written from a transaction that did not commit after all, or kept while its changelog was
    recreated: what the committed changelog does not hold leaves the store."""
    write(bootstrap, changelog, {"u0": 0, "u1": 1})
    write(bootstrap, changelog, {"ghost": 9}, commit=False)  # offsets 3 and its abort marker 4
    table = user_table(tmp_path / "user", changelog)
    store = table.store(0)
    ghost = (encode_key("ghost"), encode_value({"n": 9}))
    offset = 3 if ahead == "an aborted record" else 1_000
    store.write({ghost[0]: (ghost[1], 1), encode_key("u0"): (encode_value({"n": 0}), 1)}, offset,
                record_check(*ghost))
    assert restore([table], [0], settings, bootstrap) == 2  # read from the start
    assert table.decoded() == {0: {"u0": {"n": 0}, "u1": {"n": 1}}}
    assert table.partitions[0].offset == 1 and table.keys() == 2


def open_transaction(bootstrap: str, topic: str, rows: dict[str, int], timeout_ms: int = 60_000) -> Producer:
    """Changelog records in a transaction left open (a worker frozen or cut off mid-checkpoint: a zombie), until
    the caller ends it or `timeout_ms` passes."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"z-{uuid.uuid4().hex[:8]}",
                         "transaction.timeout.ms": timeout_ms})
    producer.init_transactions(30)
    producer.begin_transaction()
    for key, n in rows.items():
        producer.produce(topic, encode_value({"n": n}), key=encode_key(key), partition=0)
    assert producer.flush(30) == 0
    return producer


def checkpoint(bootstrap: str, changelog: str, stage: str, group: str, rows: dict[str, int], offset: int) -> None:
    """What a worker's checkpoint commits in one transaction: changelog records, and its stage partition's input
    offset with the changelog's end (the offset after the last record delivered) as the commit's metadata."""
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"w-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    delivered: list[int] = []
    for key, n in rows.items():
        producer.produce(changelog, encode_value({"n": n}), key=encode_key(key), partition=0,
                         on_delivery=lambda err, msg: delivered.append(msg.offset()))
    assert producer.flush(30) == 0
    group_member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed"})
    producer.send_offsets_to_transaction(
        [TopicPartition(stage, 0, offset, ends.encode({"user": max(delivered) + 1}))],
        group_member.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    group_member.close()


def committed_end(bootstrap: str, stage: str, group: str) -> dict:
    """The next owner's view at its assignment: the committed offset (asked stable) and the ends beside it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed"})
    try:
        [tp] = consumer.committed([TopicPartition(stage, 0)], timeout=30)
        return {"offset": tp.offset, "ends": ends.decode(tp.metadata)}
    finally:
        consumer.close()


@pytest.fixture
def stage(bootstrap, changelog):
    topic = changelog.replace("-changelog", "-stage")
    create_topics(bootstrap, [topic])
    return topic


def test_a_restore_takes_every_checkpoint_committed_above_a_transaction_left_open(bootstrap, changelog, stage,
                                                                                settings, tmp_path, monkeypatch,
                                                                                caplog):
    """A zombie's transaction left open in the changelog, then the partition's next owner commits a checkpoint
    above it. Read to the last stable offset (held at the zombie's first record until its transaction ends) a
    restore lost that checkpoint's states while its input offsets stood: those inputs were never counted again.
    Read to the end committed with the offsets, the restore waits for the zombie's transaction to end (its
    restart or transaction.timeout.ms aborts it), then takes them. A checkpoint committed while its markers are
    not written yet lies past the last stable offset the same way."""
    monkeypatch.setattr(tables_module, "RESTORE_PROGRESS_S", 0.5)
    group = f"g-{uuid.uuid4().hex[:8]}"
    write(bootstrap, changelog, {"u0": 0})
    zombie = open_transaction(bootstrap, changelog, {"ghost": 9})
    checkpoint(bootstrap, changelog, stage, group, {"u1": 1, "u2": 2}, offset=17)
    committed = committed_end(bootstrap, stage, group)
    assert committed == {"offset": 17, "ends": {"user": 5}}  # u0, its marker, the ghost, u1, u2
    table = user_table(tmp_path / "user", changelog)
    restored: list = []
    reader = threading.Thread(target=lambda: restored.append(
        restore([table], [0], settings, bootstrap, ends={(changelog, 0): committed["ends"]["user"]})))
    with caplog.at_level("WARNING", logger="modpipe.streams.state.tables"):
        reader.start()
        reader.join(4.0)
        assert reader.is_alive(), "the restore ended while committed records were held behind an open transaction"
        zombie.abort_transaction(30)
        reader.join(60)
    assert restored == [3]
    waits = [r for r in caplog.records if r.getMessage().startswith("changelog restore still reading:")]
    assert waits and waits[0].behind[0]["end"] == 5 and waits[0].behind[0]["position"] <= 2  # says why it waits
    assert not [r for r in caplog.records if r.levelname == "ERROR"]  # the records are there, held back
    assert table.decoded() == {0: {"u0": {"n": 0}, "u1": {"n": 1}, "u2": {"n": 2}}}


def test_a_restore_does_not_wait_for_a_transaction_opened_above_the_committed_end(bootstrap, changelog, stage,
                                                                                settings, tmp_path):
    """A zombie that opened its transaction after the last checkpoint committed holds nothing the restore needs:
    reading to the high watermark instead waited for it, inside the rebalance callback, for the whole
    transaction timeout."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    checkpoint(bootstrap, changelog, stage, group, {"u1": 1}, offset=3)
    zombie = open_transaction(bootstrap, changelog, {"ghost": 9})
    try:
        committed = committed_end(bootstrap, stage, group)
        table = user_table(tmp_path / "user", changelog)
        started = time.monotonic()
        assert restore([table], [0], settings, bootstrap, ends={(changelog, 0): committed["ends"]["user"]},
                       timeout_s=20) == 1
        assert time.monotonic() - started < 5
        assert table.decoded() == {0: {"u1": {"n": 1}}}
    finally:
        zombie.abort_transaction(30)


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.3)
    return value


def store_contents(settings: Settings, worker: str) -> dict[str, dict[str, dict]]:
    """What a stopped worker's stores hold, all partitions together, per table."""
    out = {}
    root = tables_dir(settings, worker)
    for name in ("user", "url", "domain", "ip", "post"):
        table = rocksdb.RocksTable(name, "-", root / name, rocksdb.Resources(16 << 20))
        for d in (root / name).iterdir() if (root / name).exists() else ():
            table.store(int(d.name))
        out[name] = {k: v for rows in table.decoded().values() for k, v in rows.items()}
        table.close()
    return out


def decisions(consumer, wanted: set[str], got: set[str], until: int, timeout_s: float) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while len(got & wanted) < until and time.monotonic() < deadline:
        got |= {pid for pid in collect_decisions(consumer, wanted - got, 0.5)}
    return got


def test_a_worker_killed_mid_stream_restores_from_its_stores_and_the_tail(local_stack, pipeline_settings, model_build):
    stack = local_stack(workers=1, modpipe_state_backend="rocksdb")  # the default, stated: this test is about it
    settings = pipeline_settings
    consumer = end_consumer(settings, stack.bootstrap, [stack.topics.decisions])
    first = produce_posts(settings, 60, "first", model_build.heldout())
    assert set(collect_decisions(consumer, set(first), 120)) == set(first)
    texts = model_build.heldout()
    second = {f"second-{i}-{j}" for i in range(10) for j in range(30)}
    sender = threading.Thread(target=lambda: [produce_posts(settings, 30, f"second-{i}", texts) and time.sleep(0.5)
                                              for i in range(10)])
    sender.start()  # 30 posts every half second: the worker is busy when it is killed
    got = decisions(consumer, second, set(), 60, 120)
    stack.workers[0].process.kill()  # mid-stream: a checkpoint may be open
    sender.join()
    assert len(got) < len(second), "every post decided before the kill"
    held = store_contents(settings, "worker-0")
    before = streaming_tables(settings, stack.bootstrap)
    # the stores hold committed states only: no key the committed changelogs do not hold
    assert all(held[t].keys() <= before[t].keys() for t in held), "a store holds an uncommitted key"
    assert sum(map(len, held.values())) > 0

    stack.start_worker(0)
    stack.wait_workers_ready(120)
    got = decisions(consumer, second, got, len(second), 180)
    consumer.close()
    assert got == second
    read_on_restart = stack.scrape()["modpipe_table_restored_records_total"]
    # the tail is at most the checkpoint committed between the stores' last write and the kill: far fewer
    # records than the changelogs' keys, which a restore from the start reads at least
    assert read_on_restart < sum(map(len, before.values())) / 2, "the restart read the whole changelog"

    stack.workers[0].process.signal(15)  # a clean stop: the stores hold the last checkpoint
    wait_for(lambda: not stack.workers[0].process.alive(), 60, "the worker stopped")
    assert store_contents(settings, "worker-0") == streaming_tables(settings, stack.bootstrap)
    # each stage partition's committed offset carries its tables' changelog ends: the offset after the last record
    # of each table partition its stores hold (streams/state/ends.py)
    committed = committed_ends(settings, stack)
    # the posts carried past their checkpoint (streams/moderation/carried.py) are kept in memory, not in the stores
    carried = {key: end for key, end in committed.items() if key[0] == "awaiting-model"}
    assert len(carried) == settings.partitions
    committed = {key: end for key, end in committed.items() if key not in carried}
    assert len(committed) >= settings.partitions  # every partition a checkpoint wrote, at the least
    assert committed == {key: end for key, end in store_ends(settings, "worker-0").items() if key in committed}


def committed_ends(settings: Settings, stack) -> dict[tuple[str, int], int]:
    consumer = Consumer({"bootstrap.servers": stack.bootstrap, "group.id": settings.app_id,
                         "isolation.level": "read_committed"})
    try:
        tps = [TopicPartition(topic, p) for topic in stack.topics.stages.values() for p in range(settings.partitions)]
        out = {}
        for tp in consumer.committed(tps, timeout=30):
            assert tp.error is None, tp
            if tp.offset < 0:
                continue  # never committed: no checkpoint wrote or read this partition
            out.update({(table, tp.partition): end for table, end in ends.decode(tp.metadata).items()})
        return out
    finally:
        consumer.close()


def store_ends(settings: Settings, worker: str) -> dict[tuple[str, int], int]:
    out = {}
    root = tables_dir(settings, worker)
    for name in ("user", "url", "domain", "ip", "post"):
        table = rocksdb.RocksTable(name, "-", root / name, rocksdb.Resources(16 << 20))
        for p in range(settings.partitions):
            offset = table.store(p).offset
            out[(name, p)] = 0 if offset is None else offset + 1
        table.close()
    return out


def test_a_partition_whose_restore_waits_holds_back_only_itself(local_stack, pipeline_settings, model_build):
    """Tables are restored off the rebalance callback, a partition number at a time: while the restore of user
    partition 0 waits for a zombie's transaction left open below its committed end, the worker decides the posts
    whose every hop avoids partition 0 (restored inside the callback, none was decided until the zombie's
    transaction ended), counts only the partitions whose tables are in, and once the zombie is gone decides the
    rest, each post once."""
    stack = local_stack(workers=0)
    settings = stack.settings
    changelog = tables_module.changelog_topic(settings.app_id, "user")
    zombie = open_transaction(stack.bootstrap, changelog, {"ghost": 9}, timeout_ms=300_000)
    checkpoint(stack.bootstrap, changelog, stack.topics.stages["user"], settings.app_id, {"held-user": 1}, offset=0)
    consumer = end_consumer(settings, stack.bootstrap, [stack.topics.decisions])
    try:
        stack.start_worker(0)
        wanted = len(stack.topics.inputs()) * settings.partitions
        wait_for(lambda: stack.assigned_partitions() > 0, 120, "the partitions without a restore to wait for")
        posts = set(produce_posts(settings, 80, "held", model_build.heldout()))
        got = collect_decisions(consumer, posts, 30)
        assigned = stack.assigned_partitions()
        assert got, "no post decided while one partition's restore waited"
        assert len(got) < len(posts), "every post decided: none of them touched partition 0"
        assert assigned <= wanted - len(stack.topics.inputs()), "partition 0 counted before its tables were in"
        zombie.abort_transaction(30)
        aborted_at = time.monotonic()
        rest = collect_decisions(consumer, posts - got.keys(), 120)
        print(f"while partition 0's restore waited: {len(got)} of {len(posts)} posts decided, {assigned} of {wanted} "
              f"partitions counted; the rest decided {time.monotonic() - aborted_at:.1f} s after the zombie's "
              "transaction ended")
        assert got.keys() | rest.keys() == posts
        assert all(len(v) == 1 for v in [*got.values(), *rest.values()])
        wait_for(lambda: stack.assigned_partitions() == wanted, 60, "every partition counted")
    finally:
        consumer.close()
