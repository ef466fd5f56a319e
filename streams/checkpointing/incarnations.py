"""Each start of a worker is a new incarnation with a transactional.id of its own: `<app id>-<worker>-<n>`.

The incarnation before it is fenced first: `init_transactions` on its id aborts whatever transaction it left
open (a SIGKILL, a crash) and bumps its epoch, so it can commit nothing more. Its id is never written with
again. The counter `n` per worker lives in a compacted topic (`TopicNames.incarnations`, keyed by worker).

Why not one stable id per worker: reusing a transactional.id reuses its producer id, and the embedded broker
(noida-db 0.2.3) answers every later fetch with all the aborted transactions of that producer id, also those
that ended before the fetched offsets. librdkafka then skips every later record of the producer id for a
read_committed reader that had already read past the abort marker: after one worker crash, the other workers
(reading its stage bundles) and the platform (reading its decisions) would silently lose all it wrote after
its restart. Measured: a live read_committed consumer never got any of four later committed transactions of
the restarted producer, while a consumer that started after them read them all. A fresh id gets a fresh
producer id. On Apache Kafka this costs one InitProducerId per start; a zombie of the same incarnation is
fenced by its epoch, one of an older group generation by KIP-447 (streams/checkpointing/checkpoint.py)."""

from __future__ import annotations

import time
import uuid

import orjson

from modpipe import log
from modpipe.services.offsets import watermarks
from modpipe.settings import Settings

_log = log.get(__name__)


def transactional_id(settings: Settings, worker: str, incarnation: int) -> str:
    return f"{settings.app_id}-{worker}-{incarnation}"


def latest(settings: Settings, bootstrap: str, topic: str, worker: str, timeout_s: float = 60.0) -> int | None:
    """The last incarnation recorded for `worker` (None: it never started)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**settings.kafka_consumer_config(), "bootstrap.servers": bootstrap,
                         "group.id": f"modpipe-incarnations-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False})
    try:
        ends = {}
        deadline = time.monotonic() + timeout_s
        for p in consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions:
            low, high = watermarks(consumer, TopicPartition(topic, p), max(1.0, deadline - time.monotonic()))
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        found = None
        while ends:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic} not read to its end within {timeout_s:.0f} s")
            for msg in consumer.consume(500, 0.2):
                if not msg.error() and msg.key() == worker.encode() and msg.value():
                    found = orjson.loads(msg.value())["incarnation"]
            for tp in consumer.position([TopicPartition(topic, p) for p in ends]):
                if tp.offset >= ends[tp.partition]:
                    del ends[tp.partition]
        return found
    finally:
        consumer.close()


def start(settings: Settings, bootstrap: str, topic: str, worker: str, timeout_s: float = 60.0) -> str:
    """Fence the previous incarnation of `worker`, record the next one, and return its transactional.id."""
    from confluent_kafka import Producer

    previous = latest(settings, bootstrap, topic, worker, timeout_s)
    base = {**settings.kafka_client_config(), "bootstrap.servers": bootstrap}
    if previous is not None:
        # aborts what it left open; its producer id is not used again
        Producer({**base, "transactional.id": transactional_id(settings, worker, previous)}).init_transactions(timeout_s)
    incarnation = 0 if previous is None else previous + 1
    registry = Producer({**base, "acks": "all", "enable.idempotence": True})
    registry.produce(topic, key=worker.encode(), value=orjson.dumps({"incarnation": incarnation}))
    if registry.flush(timeout_s):
        raise TimeoutError(f"could not record incarnation {incarnation} of {worker} in {topic}")
    _log.info("incarnation started", extra={"worker": worker, "incarnation": incarnation,
                                            "fenced": None if previous is None else previous})
    return transactional_id(settings, worker, incarnation)
