"""A transaction open while the broker restarts (streams/checkpointing/outbox.py). A broker of its own: the session's must not
be restarted.

On the embedded broker, which restarts without its transaction coordinator's state, a worker's late records
would join a transaction nobody can end, and every read_committed reader of that partition would stop in
front of it: with MODPIPE_ABORT_ON_BROKERS_DOWN=on (what its launcher sets) the outbox dooms its open
transaction when every broker goes away; nothing of it reaches the restarted broker, and what other producers
commit afterwards stays readable. Apache Kafka keeps the transaction: with the setting at its default the
same producer commits it after the restart, records made before and while the broker was away alike."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from modpipe.streams.checkpointing.outbox import Outbox, Pending, TransactionDoomed

from modpipe.services.broker import EmbeddedBroker
from modpipe.services.process import free_port
from modpipe.settings import Settings
from tests.fixtures.kafka import create_topics

pytestmark = pytest.mark.integration


def read_committed(bootstrap: str, topic: str, wait_s: float, until: bytes = b"after") -> list[bytes]:
    """What a read_committed reader from the start gets within `wait_s`."""
    settings = Settings.from_env({})
    consumer = Consumer({**settings.kafka_consumer_config(), "bootstrap.servers": bootstrap,
                         "group.id": f"reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and until not in got:
        got += [m.value() for m in consumer.consume(100, 0.2) if not m.error()]
    consumer.close()
    return got


async def transaction_holding_one_record(settings: Settings, bootstrap: str, topic: str):
    """A started transactional Outbox whose open transaction holds one delivered record (`before-restart`),
    and the list its fatal errors go to."""
    loop = asyncio.get_running_loop()
    outbox = Outbox(settings, bootstrap, linger_ms=5, transactional_id=f"w-{uuid.uuid4().hex[:6]}")
    fatal: list[Exception] = []
    outbox.on_fatal = fatal.append
    await loop.run_in_executor(None, outbox.start, loop)
    before = Pending()
    outbox.produce(topic, b"before-restart", partition=0, pending=before)
    before.seal()
    deadline = time.monotonic() + 30
    while before.holds and time.monotonic() < deadline:  # delivered: the transaction holds a record
        await asyncio.sleep(0.05)
    assert before.holds == 0
    return outbox, fatal


def test_on_the_embedded_broker_a_transaction_open_across_its_restart_is_doomed_and_never_blocks_readers(tmp_path):
    broker = EmbeddedBroker(tmp_path / "data", free_port()).start()
    bootstrap, topic = broker.bootstrap, "out"
    create_topics(bootstrap, [topic])
    settings = Settings.from_env({"MODPIPE_ABORT_ON_BROKERS_DOWN": "on"})

    async def scenario() -> dict:
        loop = asyncio.get_running_loop()
        outbox, fatal = await transaction_holding_one_record(settings, bootstrap, topic)

        await loop.run_in_executor(None, broker.stop)
        deadline = time.monotonic() + 10
        while outbox.doomed is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        late_errors: list[Exception] = []
        late = Pending(on_error=late_errors.append)
        outbox.produce(topic, b"late", partition=0, pending=late)  # made while the broker is away
        await loop.run_in_executor(None, broker.start)
        await asyncio.sleep(3)  # librdkafka reconnects: a queued record would be delivered now
        with pytest.raises(TransactionDoomed):
            await loop.run_in_executor(None, outbox.commit, {}, None)
        await loop.run_in_executor(None, outbox.close)
        return {"doomed": outbox.doomed, "fatal": fatal, "late_errors": late_errors}

    try:
        result = asyncio.run(scenario())
        assert result["doomed"], result
        assert any(isinstance(e, TransactionDoomed) for e in result["fatal"]), result  # the worker stops
        assert len(result["late_errors"]) == 1 and isinstance(result["late_errors"][0], TransactionDoomed), result

        other = Producer({**settings.kafka_client_config(), "bootstrap.servers": bootstrap,
                          "transactional.id": f"other-{uuid.uuid4().hex[:6]}"})
        other.init_transactions(30)
        other.begin_transaction()
        other.produce(topic, b"after", partition=0)
        other.commit_transaction(30)
        got = read_committed(bootstrap, topic, wait_s=15)
        # the doomed transaction's records are never read; what was committed after it is
        assert got == [b"after"], got
    finally:
        broker.stop()


def test_on_apache_kafka_a_transaction_open_across_a_broker_restart_commits_whole(tmp_path):
    """SIGKILL of the only node mid-transaction, then its restart on the same data: the open transaction is
    kept by the coordinator, the producer reconnects, and its commit makes every record readable once."""
    from modpipe.services.apache_kafka import KafkaCluster

    base = Settings.from_env({})
    broker = KafkaCluster(tmp_path / "data", nodes=1, version=base.kafka_version, cache_dir=base.cache_dir,
                          heap_mb=384).start()
    bootstrap, topic = broker.bootstrap, "out"
    create_topics(bootstrap, [topic])
    settings = Settings.from_env({})  # MODPIPE_ABORT_ON_BROKERS_DOWN=off, the default

    async def scenario() -> dict:
        loop = asyncio.get_running_loop()
        outbox, fatal = await transaction_holding_one_record(settings, bootstrap, topic)
        await loop.run_in_executor(None, broker.kill)
        await asyncio.sleep(2)  # every broker gone: the embedded broker's outbox would doom the transaction here
        late_errors: list[Exception] = []
        late = Pending(on_error=late_errors.append)
        outbox.produce(topic, b"while-away", partition=0, pending=late)
        late.seal()
        await loop.run_in_executor(None, broker.start)
        deadline = time.monotonic() + 60
        while late.holds and not late_errors and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await loop.run_in_executor(None, outbox.commit, {}, None)
        await loop.run_in_executor(None, outbox.close)
        return {"doomed": outbox.doomed, "fatal": fatal, "late_errors": late_errors, "late_holds": late.holds}

    try:
        result = asyncio.run(scenario())
        assert result == {"doomed": None, "fatal": [], "late_errors": [], "late_holds": 0}, result
        got = read_committed(bootstrap, topic, wait_s=15, until=b"while-away")
        assert got == [b"before-restart", b"while-away"], got
    finally:
        broker.stop()
