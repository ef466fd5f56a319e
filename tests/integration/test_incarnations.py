"""A worker's incarnations on the real broker (streams/checkpointing/incarnations.py): each start gets a transactional.id
of its own and fences the one before, whose open transaction is aborted; a read_committed reader that was
already reading sees everything the new incarnation commits afterwards."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from modpipe.streams.checkpointing import incarnations
from modpipe.streams.moderation.topics import TopicNames, ensure_topics

from modpipe.settings import Settings

pytestmark = pytest.mark.integration

# A worker's first incarnation: opens a transaction, writes, and dies without committing (SIGKILL-like).
DIE_MID_TRANSACTION = """
import os, sys
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2]})
p.init_transactions(30); p.begin_transaction()
for i in range(4):
    p.produce(sys.argv[3], value=b"left-open", partition=i)
p.flush(30)
os._exit(0)
"""


def test_each_start_fences_the_last_and_live_readers_see_what_follows(bootstrap):
    tag = uuid.uuid4().hex[:8]
    settings = Settings.from_env(bootstrap_servers=bootstrap, topic_prefix=f"inc{tag}.", app_id=f"inc-{tag}",
                                 partitions=4)
    ensure_topics(settings, bootstrap)
    names = TopicNames.from_settings(settings)
    out = names.decisions

    first = incarnations.start(settings, bootstrap, names.incarnations, "w")
    assert first == f"{settings.app_id}-w-0"
    seen: list[bytes] = []
    stop = threading.Event()
    reader = Consumer({**settings.kafka_consumer_config(), "bootstrap.servers": bootstrap,
                       "group.id": f"reader-{tag}", "enable.auto.commit": False})
    reader.assign([TopicPartition(out, p, 0) for p in range(4)])

    def read():
        while not stop.is_set():
            msg = reader.poll(0.1)
            if msg is not None and not msg.error():
                seen.append(msg.value())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    try:
        subprocess.run([sys.executable, "-c", DIE_MID_TRANSACTION, bootstrap, first, out], check=True, timeout=60)
        time.sleep(1)  # the reader is live at the open transaction's start

        second = incarnations.start(settings, bootstrap, names.incarnations, "w")
        assert second == f"{settings.app_id}-w-1"
        producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": second})
        producer.init_transactions(30)
        for n in range(3):
            producer.begin_transaction()
            for p in range(4):
                producer.produce(out, value=f"after-{n}".encode(), partition=p)
            producer.commit_transaction(30)
        deadline = time.monotonic() + 30
        while len([v for v in seen if v.startswith(b"after-")]) < 12 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        thread.join(5)
        reader.close()
    assert b"left-open" not in seen, "the dead incarnation's open transaction reached a read_committed reader"
    assert sorted(v for v in seen if v.startswith(b"after-")) == sorted(f"after-{n}".encode() for n in range(3)
                                                                        for _ in range(4))
    assert incarnations.latest(settings, bootstrap, names.incarnations, "w") == 1
