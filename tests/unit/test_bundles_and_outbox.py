"""modpipe.streams.moderation.bundles (Kafka's murmur2, placing items, one record per partition) and modpipe.streams.checkpointing.outbox (`Pending`:
complete only after every delivery; the transactional `Outbox`), without a broker. The partitioner check
against librdkafka uses librdkafka's own in-process mock cluster (`test.mock.num.brokers`), no broker."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import orjson
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from modpipe.streams.checkpointing import outbox
from modpipe.streams.checkpointing.outbox import DeliveryFailed, Outbox, Pending, TransactionDoomed
from modpipe.streams.moderation import bundles
from modpipe.streams.moderation.bundles import Bundler, decode_bundle, murmur2, partition_for

from modpipe.settings import Settings

# Apache Kafka's UtilsTest.testMurmur2 (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java),
# checked against aiokafka's murmur2 (which returns the same 32 bits unsigned) before it was replaced.
KAFKA_MURMUR2 = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
}


@pytest.mark.parametrize("text,expected", KAFKA_MURMUR2.items())
def test_murmur2_is_kafkas(text, expected):
    assert murmur2(text.encode()) == expected


def test_murmur2_covers_every_tail_length_as_a_signed_32_bit_int():
    # 0 to 3 bytes past the last 4-byte block take the tail path; every result is a Java int
    for n in range(0, 40):
        h = murmur2(bytes(range(n)))
        assert -2**31 <= h < 2**31
    assert len({murmur2(bytes(range(n))) for n in range(40)}) == 40


def test_partition_for_is_kafkas_default_partitioner():
    for text, h in KAFKA_MURMUR2.items():
        for partitions in (1, 3, 4, 12):
            assert partition_for(text, partitions) == (h & 0x7FFFFFFF) % partitions


def test_partition_for_matches_librdkafkas_murmur2_random_partitioner():
    """What loadgen's producers (`partitioner: murmur2_random`) pick, librdkafka's own hash, for the same keys.
    The mock cluster auto-creates the topic with 4 partitions (the pipeline's default count)."""
    keys = [*KAFKA_MURMUR2, "user-1", "u42", "example.com", "https://example.com/a?b=1", "10.0.0.7", "café",
            "\u65e5\u672c", "x" * 101]
    producer = Producer({"test.mock.num.brokers": 1, "partitioner": "murmur2_random",
                         "logger": logging.getLogger("librdkafka.mock")})
    chosen: dict[str, int] = {}

    def delivered(err, msg):
        assert err is None, err
        chosen[msg.key().decode()] = msg.partition()

    for key in keys:
        producer.produce("murmur2-check", key=key.encode(), value=b"x", on_delivery=delivered)
    assert producer.flush(10) == 0
    partitions = len(producer.list_topics("murmur2-check", timeout=5).topics["murmur2-check"].partitions)
    assert partitions == 4
    assert chosen == {key: partition_for(key, partitions) for key in keys}
    assert len(set(chosen.values())) > 1  # the keys spread: not a trivial agreement


def test_partition_for_is_stable_and_in_range():
    assert partition_for("user-1", 4) == partition_for("user-1", 4)
    assert {partition_for(f"user-{i}", 4) for i in range(200)} == {0, 1, 2, 3}


def test_a_bundle_holds_items_of_one_partition_and_keeps_their_order():
    b = Bundler(4)
    keys = [f"k{i}" for i in range(40)]
    for i, key in enumerate(keys):
        b.add("features.user", key, {"i": i, "key": key})
    records = list(b.records())
    assert not b and b.items == 0  # emptied
    assert len(records) == len({partition_for(k, 4) for k in keys})
    seen = []
    for topic, partition, value, n in records:
        items = decode_bundle(value)
        assert topic == "features.user" and len(items) == n
        assert all(partition_for(item["key"], 4) == partition for item in items)
        assert [item["i"] for item in items] == sorted(item["i"] for item in items)
        seen += [item["i"] for item in items]
    assert sorted(seen) == list(range(40))


def test_a_large_destination_is_split_into_several_records(monkeypatch):
    monkeypatch.setattr(bundles, "MAX_BUNDLE_BYTES", 1000)
    b = Bundler(1)
    for i in range(50):
        b.add("t", "k", {"i": i, "pad": "x" * 100})
    records = list(b.records())
    assert len(records) > 1 and all(len(value) <= 1000 + 200 for _, _, value, _ in records)
    assert [item["i"] for *_, value, _ in [(r[0], r[1], r[2], r[3]) for r in records]
            for item in decode_bundle(value)] == list(range(50))


def test_decode_bundle_refuses_other_records():
    assert decode_bundle(orjson.dumps({"items": [{"a": 1}]})) == [{"a": 1}]
    for bad in (b"[]", b'{"x": 1}', b'{"items": 3}'):
        with pytest.raises(ValueError):
            decode_bundle(bad)
    with pytest.raises(orjson.JSONDecodeError):
        decode_bundle(b"not json")


def test_pending_is_done_only_after_every_hold_is_released():
    done = []
    p = Pending(on_done=lambda: done.append(1))
    p.hold(2)  # two records produced
    p.seal()  # the creator has produced everything
    p.release()
    assert not done and p.holds == 1
    p.release()
    assert done == [1] and p.holds == 0


def test_a_failed_delivery_is_never_done_and_reports_the_error():
    errors, done = [], []
    p = Pending(on_error=errors.append, on_done=lambda: done.append(1))
    p.hold()
    p.seal()
    p.release(RuntimeError("broker gone"))
    assert len(errors) == 1 and not done and p.holds == 1  # never done: the worker stops, the input comes again


class FakeProducer:
    """confluent_kafka.Producer's transactional calls, recorded."""

    def __init__(self, conf):
        self.conf = conf
        self.calls: list[tuple] = []
        self.produced: list[tuple] = []

    def init_transactions(self, timeout):
        self.calls.append(("init_transactions",))

    def begin_transaction(self):
        self.calls.append(("begin_transaction",))

    def send_offsets_to_transaction(self, offsets, group_metadata, timeout):
        self.calls.append(("send_offsets_to_transaction", offsets, group_metadata))

    def commit_transaction(self, timeout):
        self.calls.append(("commit_transaction",))

    def abort_transaction(self, timeout):
        self.calls.append(("abort_transaction",))

    def produce(self, topic, **kwargs):
        self.produced.append((topic, kwargs))

    def poll(self, timeout):
        return 0

    def flush(self, timeout):
        self.calls.append(("flush",))
        return 0

    def purge(self, in_queue=True, in_flight=True):
        self.calls.append(("purge",))

    def __len__(self):
        return 0


@pytest.fixture
def fake_outbox(monkeypatch):
    monkeypatch.setattr(outbox, "Producer", FakeProducer)
    return Outbox(Settings.from_env({}), "b:9092", linger_ms=5, transactional_id="worker-0")


def test_the_outbox_is_an_idempotent_transactional_producer(fake_outbox):
    conf = fake_outbox.producer.conf
    assert fake_outbox.transactional
    assert conf["transactional.id"] == "worker-0" and conf["enable.idempotence"] is True and conf["acks"] == "all"
    assert conf["bootstrap.servers"] == "b:9092"


def test_commit_sends_the_input_offsets_with_the_group_metadata_then_opens_the_next_transaction(fake_outbox):
    producer = fake_outbox.producer
    fake_outbox.commit({("posts", 0): 11, ("features.user", 3): 5}, "group-metadata")
    (name, offsets, metadata), *rest = producer.calls
    assert name == "send_offsets_to_transaction" and metadata == "group-metadata"
    assert sorted((tp.topic, tp.partition, tp.offset) for tp in offsets) == [("features.user", 3, 5), ("posts", 0, 11)]
    assert all(isinstance(tp, TopicPartition) for tp in offsets)
    assert rest == [("commit_transaction",), ("begin_transaction",)]


def test_commit_sends_each_offset_with_its_commit_metadata(fake_outbox):
    """A stage partition's offset carries its tables' changelog ends (streams/state/ends.py) in the same request."""
    fake_outbox.commit({("posts", 0): 11, ("features.user", 3): 5}, "group-metadata",
                       metadata={("features.user", 3): "ends"})
    (_, offsets, _), *_ = fake_outbox.producer.calls
    assert sorted((tp.topic, tp.offset, tp.metadata) for tp in offsets) == [("features.user", 5, "ends"),
                                                                             ("posts", 11, None)]


def test_a_retriable_transaction_error_is_asked_again_and_others_are_raised(fake_outbox, monkeypatch):
    """A group coordinator that moved with a killed node answers NOT_COORDINATOR, which librdkafka calls
    retriable: the request is sent again; an error that needs an abort (a fenced generation) is not."""
    from confluent_kafka import KafkaError, KafkaException

    monkeypatch.setattr(outbox, "TXN_RETRY_S", 0.001)
    producer = fake_outbox.producer
    answers = [KafkaError(KafkaError.NOT_COORDINATOR, "moved", retriable=True),
               KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "loading", retriable=True)]
    send = producer.send_offsets_to_transaction

    def flaky(offsets, metadata, timeout):
        send(offsets, metadata, timeout)
        if answers:
            raise KafkaException(answers.pop(0))

    producer.send_offsets_to_transaction = flaky
    fake_outbox.commit({("posts", 0): 11}, "group-metadata")
    assert [c[0] for c in producer.calls] == ["send_offsets_to_transaction"] * 3 + ["commit_transaction",
                                                                                  "begin_transaction"]
    del producer.calls[:]
    answers[:] = [KafkaError(KafkaError.ILLEGAL_GENERATION, "fenced", txn_requires_abort=True)]
    with pytest.raises(KafkaException):
        fake_outbox.commit({("posts", 0): 12}, "group-metadata")
    assert [c[0] for c in producer.calls] == ["send_offsets_to_transaction"]


def test_commit_without_offsets_commits_the_transaction_alone(fake_outbox):
    fake_outbox.commit({}, "group-metadata")
    assert fake_outbox.producer.calls == [("commit_transaction",), ("begin_transaction",)]


def test_a_produced_record_holds_its_pending_until_its_delivery_report():
    async def scenario():
        box = Outbox(Settings.from_env({}), "b:9092", linger_ms=5)  # the delivery path only: no producer thread
        box.producer = FakeProducer({})
        box._loop = asyncio.get_running_loop()
        done, errors, offsets = [], [], []
        ok = Pending(on_error=errors.append, on_done=lambda: done.append("ok"))
        bad = Pending(on_error=errors.append, on_done=lambda: done.append("bad"))
        box.produce("decisions", b"v1", key=b"k", pending=ok, on_delivered=offsets.append)
        box.produce("decisions", b"v2", pending=bad)
        ok.seal()
        bad.seal()
        assert ok.holds == 1 and bad.holds == 1 and not done

        class Msg:
            def offset(self):
                return 41

        (_, first), (_, second) = box.producer.produced
        first["on_delivery"](None, Msg())
        second["on_delivery"]("broker gone", None)
        box._hand_over()
        await asyncio.sleep(0)
        return done, errors, offsets

    done, errors, offsets = asyncio.run(scenario())
    assert done == ["ok"] and offsets == [41]
    assert len(errors) == 1 and isinstance(errors[0], DeliveryFailed)


class BrokersDown:
    """librdkafka's error for 'every broker connection is down' (transient, not fatal)."""

    def fatal(self):
        return False

    def code(self):
        return KafkaError._ALL_BROKERS_DOWN


def lose_every_broker_between_two_records(box: Outbox) -> tuple[list, list]:
    """One record, every broker gone, a second record: the fatal errors and the second record's errors."""
    async def scenario():
        box.start(asyncio.get_running_loop())
        fatal = []
        box.on_fatal = fatal.append
        box.produce("decisions", b"v1")
        box._on_client_error(BrokersDown())
        errors = []
        late = Pending(on_error=errors.append)
        box.produce("decisions", b"v2", pending=late)
        await asyncio.sleep(0)
        return fatal, errors

    return asyncio.run(scenario())


def test_losing_every_broker_keeps_the_transaction_by_default(fake_outbox):
    """Apache Kafka keeps an open transaction across a moment without brokers (MODPIPE_ABORT_ON_BROKERS_DOWN off)."""
    fatal, errors = lose_every_broker_between_two_records(fake_outbox)
    fake_outbox.close()
    assert fake_outbox.doomed is None and fatal == [] and errors == []
    assert len(fake_outbox.producer.produced) == 2


def test_on_the_embedded_broker_losing_every_broker_dooms_the_open_transaction(monkeypatch):
    monkeypatch.setattr(outbox, "Producer", FakeProducer)
    fake_outbox = Outbox(Settings.from_env({"MODPIPE_ABORT_ON_BROKERS_DOWN": "on"}), "b:9092", linger_ms=5,
                         transactional_id="worker-0")

    # the second record is refused: it would reach a restarted broker
    fatal, errors = lose_every_broker_between_two_records(fake_outbox)
    fake_outbox.close()
    assert fake_outbox.doomed and ("purge",) in fake_outbox.producer.calls
    assert len(fake_outbox.producer.produced) == 1  # only the record from before
    assert len(fatal) == 1 and isinstance(fatal[0], TransactionDoomed)  # the worker stops
    assert len(errors) == 1 and isinstance(errors[0], TransactionDoomed)
    with pytest.raises(TransactionDoomed):
        fake_outbox.commit({("posts", 0): 3}, "group-metadata")
    assert not any(c[0] in ("send_offsets_to_transaction", "commit_transaction") for c in fake_outbox.producer.calls)


def test_no_broker_yet_at_start_dooms_nothing(fake_outbox):
    fake_outbox._on_client_error(BrokersDown())  # before init_transactions: the broker is not up yet
    assert fake_outbox.doomed is None and fake_outbox.producer.calls == []


def test_a_stopping_worker_commits_nothing_even_from_a_checkpoint_under_way(fake_outbox):
    fake_outbox.stop_committing()
    with pytest.raises(DeliveryFailed):
        fake_outbox.commit({("posts", 0): 3}, "group-metadata")
    assert fake_outbox.producer.calls == []


def test_close_waits_for_a_commit_under_way_then_aborts(fake_outbox):
    order = []
    entered, release = threading.Event(), threading.Event()

    def slow_send_offsets(offsets, metadata, timeout):
        entered.set()
        release.wait(5)
        order.append("send_offsets_to_transaction")

    fake_outbox.producer.send_offsets_to_transaction = slow_send_offsets
    fake_outbox.producer.abort_transaction = lambda timeout: order.append("abort_transaction")
    raised = []

    def commit():
        try:
            fake_outbox.commit({("posts", 0): 3}, "m")
        except DeliveryFailed as exc:
            raised.append(exc)

    committer = threading.Thread(target=commit)
    committer.start()
    assert entered.wait(5)
    closer = threading.Thread(target=fake_outbox.close)
    closer.start()
    time.sleep(0.2)
    assert order == []  # close waits: librdkafka refuses a second transactional call (_CONFLICT)
    release.set()
    committer.join(5)
    closer.join(5)
    # the commit stopped before commit_transaction (the worker is stopping), then close aborted
    assert order == ["send_offsets_to_transaction", "abort_transaction"] and len(raised) == 1
    assert ("commit_transaction",) not in fake_outbox.producer.calls


def test_a_commit_blocked_for_good_leaves_the_outbox_hung_after_close(fake_outbox):
    """librdkafka's send_offsets_to_transaction past its own timeout (confluentinc/librdkafka#5456): the close
    purges instead of waiting, and says the request is still blocked, so the worker exits without joining it."""
    entered, release = threading.Event(), threading.Event()

    def blocked(offsets, metadata, timeout):
        entered.set()
        release.wait(10)

    fake_outbox.producer.send_offsets_to_transaction = blocked
    raised = []

    def commit():
        try:
            fake_outbox.commit({("posts", 0): 3}, "m")
        except DeliveryFailed as exc:  # it returns at last, into a worker that is stopping
            raised.append(exc)

    committer = threading.Thread(target=commit, daemon=True)
    committer.start()
    assert entered.wait(5) and not fake_outbox.hung()
    fake_outbox.close(timeout=0.2)
    assert fake_outbox.hung() and ("purge",) in fake_outbox.producer.calls
    release.set()
    committer.join(5)
    assert not fake_outbox.hung() and len(raised) == 1


def test_close_purges_what_it_cannot_abort(fake_outbox):
    def abort_fails(timeout):
        raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    fake_outbox.producer.abort_transaction = abort_fails
    fake_outbox.close(timeout=0.1)
    assert ("purge",) in fake_outbox.producer.calls and ("flush",) not in fake_outbox.producer.calls


def test_a_record_queued_while_the_transaction_is_doomed_is_purged(fake_outbox):
    loop = asyncio.new_event_loop()
    fake_outbox.start(loop)
    real_produce = fake_outbox.producer.produce

    def produce_while_dooming(topic, **kwargs):  # the librdkafka thread dooms it in the middle of produce()
        fake_outbox.doomed = "every broker went away with a transaction open"
        real_produce(topic, **kwargs)

    fake_outbox.producer.produce = produce_while_dooming
    fake_outbox.produce("decisions", b"v1")
    fake_outbox.close()
    loop.close()
    calls = [c[0] for c in fake_outbox.producer.calls]
    assert len(fake_outbox.producer.produced) == 1 and calls.index("purge") < calls.index("abort_transaction")


def test_records_of_the_next_epoch_wait_for_the_next_transaction_in_their_order(fake_outbox):
    """While a checkpoint commits epoch 0, rounds of epoch 1 go on: their records must not enter epoch 0's
    transaction, and they enter the next one in the order they were made."""
    box = fake_outbox
    now, later = Pending(epoch=0), Pending(epoch=1)
    box.produce("decisions", b"e0-a", pending=now)
    box.produce("decisions", b"e1-a", pending=later)
    box.produce("features.user", b"e1-b", pending=later)
    box.produce("decisions", b"e0-b", pending=now)
    box.produce("posts.dlq", b"untagged")  # no epoch: the open transaction's
    assert [kw["value"] for _, kw in box.producer.produced] == [b"e0-a", b"e0-b", b"untagged"]
    assert later.holds == 3  # its own + two records not yet delivered
    box.commit({}, "group-metadata")
    box.advance()
    assert [kw["value"] for _, kw in box.producer.produced] == [b"e0-a", b"e0-b", b"untagged", b"e1-a", b"e1-b"]
    assert box.head_epoch == 1
    box.produce("decisions", b"e1-c", pending=later)  # epoch 1 is the open transaction's now: straight in
    assert box.producer.produced[-1][1]["value"] == b"e1-c"


def test_records_held_for_the_next_transaction_cost_their_length_not_orjsons_buffer(fake_outbox):
    import tracemalloc

    box = fake_outbox
    later = Pending(epoch=1)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    values = [orjson.dumps({"post_id": f"p{i}", "text": "x" * 3000}) for i in range(50)]  # as a round makes them
    keys = [orjson.dumps(f"p{i}") for i in range(50)]
    length = sum(len(k) + len(v) for k, v in zip(keys, values, strict=True))
    for key, value in zip(keys, values, strict=True):
        box.produce("decisions", value, key=key, pending=later)
    del keys, values  # what the round made: only the outbox holds the records now
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert box.later_bytes == length
    # orjson's own results would hold 50 x (32 KB + 4 KB); the copies ~3 KB each, with the outbox's bookkeeping
    assert held < 50 * 4_500, held
    box.commit({}, "group-metadata")
    box.advance()
    assert [orjson.loads(kw["value"])["post_id"] for _, kw in box.producer.produced] == [f"p{i}" for i in range(50)]


def test_a_record_two_epochs_ahead_is_refused(fake_outbox):
    errors: list[Exception] = []
    box = fake_outbox
    box.produce("decisions", b"v", pending=Pending(on_error=errors.append, epoch=2))
    assert box.producer.produced == [] and len(errors) == 1 and "epoch 2" in str(errors[0])


def test_held_back_records_are_dropped_with_an_error_when_the_transaction_is_doomed(fake_outbox):
    errors: list[Exception] = []
    box = fake_outbox
    box.produce("decisions", b"v", pending=Pending(on_error=errors.append, epoch=1))
    box.doom("every broker went away with a transaction open")
    box.advance()
    assert box.producer.produced == [] and len(errors) == 1 and isinstance(errors[0], TransactionDoomed)
