"""Apache Kafka fences a zombie's commit by the group generation (KIP-447), with no help from the worker.

A member of a consumer group takes a partition, and its transactional producer (the worker's own `Outbox`)
writes a record for it. Then the process freezes (SIGSTOP) past its session; the group gives the partition to
another member. Woken, it commits its transaction with the input offset and the group metadata it read at
its assignment, as a worker's checkpoint does. The broker refuses the offsets (an older generation, or a
member it no longer knows), the transaction is aborted, and a read_committed reader never sees the record.
The freeze guard (MODPIPE_FREEZE_GUARD) is off, as it is by default; nothing in the zombie reacts to the lost
assignment either: the refusal is the broker's alone. The embedded broker checks no generation
(docs/operations.md), so this runs on Apache Kafka only."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from modpipe.loadgen.chaos import read_all

from modpipe.settings import Settings
from tests.fixtures.kafka import create_topics
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SESSION_MS = 6000  # the broker's smallest group.min.session.timeout.ms
FENCING_ERRORS = {"ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID", "FENCED_INSTANCE_ID"}

ZOMBIE = """
import asyncio, json, os, sys
from confluent_kafka import Consumer, KafkaException
from modpipe.settings import Settings
from modpipe.streams.checkpointing.outbox import Outbox, Pending

bootstrap, group, source, out, woke, txn_id = sys.argv[1:7]
SESSION_MS = int(sys.argv[7])
settings = Settings.from_env({})
assert settings.freeze_guard == "off"
consumer = Consumer({**settings.kafka_consumer_config(), "bootstrap.servers": bootstrap, "group.id": group,
                     "group.instance.id": "zombie", "session.timeout.ms": SESSION_MS,
                     "heartbeat.interval.ms": 1000, "partition.assignment.strategy": "range",
                     "enable.auto.commit": False, "auto.offset.reset": "earliest"})
consumer.subscribe([source])
record = None
while record is None:  # the assignment, then the one input record
    m = consumer.poll(0.2)
    if m is not None and not m.error():
        record = m
metadata = consumer.consumer_group_metadata()  # what a worker reads at its assignment

async def main():
    loop = asyncio.get_running_loop()
    outbox = Outbox(settings, bootstrap, linger_ms=1, transactional_id=txn_id)
    await loop.run_in_executor(None, outbox.start, loop)
    done = Pending()
    outbox.produce(out, b"from-the-zombie", partition=0, pending=done)
    done.seal()
    while done.holds:
        await asyncio.sleep(0.02)
    print("WRITTEN", flush=True)  # the test freezes this process now
    while not os.path.exists(woke):
        await asyncio.sleep(0.02)
    offsets = {(record.topic(), record.partition()): record.offset() + 1}
    try:
        await loop.run_in_executor(None, outbox.commit, offsets, metadata)
        result = {"committed": True}
    except KafkaException as exc:
        err = exc.args[0]
        result = {"committed": False, "code": err.name(), "abortable": err.txn_requires_abort(),
                  "error": str(err)}
        await loop.run_in_executor(None, outbox.abort)
    outbox.producer.flush(10)
    print("RESULT " + json.dumps(result), flush=True)

asyncio.run(main())
os._exit(0)  # leaving the group is not what is tested
"""


def test_apache_kafka_refuses_a_frozen_members_transactional_offsets(kafka_broker, bootstrap, tmp_path):
    if Settings.from_env().broker != "kafka":
        pytest.skip("the embedded broker does not check the group generation of a transaction's offsets")
    tag = uuid.uuid4().hex[:8]
    source, out, group = f"fence-in-{tag}", f"fence-out-{tag}", f"fence-{tag}"
    create_topics(bootstrap, [source, out])
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(source, b"post", partition=0)
    assert producer.flush(30) == 0
    woke = tmp_path / "woke"
    zombie = subprocess.Popen([sys.executable, "-c", ZOMBIE, bootstrap, group, source, out, str(woke),
                               f"zombie-{tag}", str(SESSION_MS)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    other = None
    try:
        line = zombie.stdout.readline()
        assert line.strip() == "WRITTEN", (line, zombie.stderr.read() if zombie.poll() is not None else "")
        zombie.send_signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        # the group's other member: given the partition once the frozen member's session has expired
        other = Consumer({**Settings.from_env({}).kafka_consumer_config(), "bootstrap.servers": bootstrap,
                          "group.id": group, "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 1000,
                          "partition.assignment.strategy": "range", "enable.auto.commit": False})
        other.subscribe([source])
        wait_for(lambda: other.poll(0.2) is None and bool(other.assignment()), 60, "the partition taken over")
        takeover_s = time.monotonic() - frozen_at
        zombie.send_signal(signal.SIGCONT)
        woke.write_text("")
        stdout, stderr = zombie.communicate(timeout=90)
        results = [json.loads(ln[len("RESULT "):]) for ln in stdout.splitlines() if ln.startswith("RESULT ")]
        assert results, stderr[-3000:]
        result = results[0]
        settings = Settings.from_env({})
        committed = [m.value() for m in read_all(settings, bootstrap, [out])]
        written = [m.value() for m in read_all(settings, bootstrap, [out], "read_uncommitted")]
        report = {**result, "takeover_s": round(takeover_s, 1), "read_committed": committed,
                  "read_uncommitted": written}
        print("generation fencing:", json.dumps(report, default=str))
        assert written == [b"from-the-zombie"], report  # it did write the record ...
        assert committed == [], report  # ... which no read_committed reader is given
        assert result["committed"] is False and result["code"] in FENCING_ERRORS, report  # the broker said no
        assert result["abortable"], report
    finally:
        if zombie.poll() is None:
            zombie.send_signal(signal.SIGCONT)
            zombie.kill()
            zombie.wait()
        if other is not None:
            other.close()
