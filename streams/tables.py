"""Feature tables: each table partition's states in the worker's memory, backed by a changelog topic.

A table partition lives on the worker that owns the stage-topic partition of the same number (the stage
topics are partitioned by the key their tables count). When partitions are assigned, the worker restores each
of their table partitions by reading its changelog to the end, `read_committed`: only states that were
committed together with the input offsets that produced them (one Kafka transaction per checkpoint,
streams/checkpoint.py). So a restored table never runs ahead of the committed input, and the input processed
again after a crash is counted once, from the state as it was when that input's offsets were committed.

States are written once per changed key per checkpoint (`streams/table_states.py`): into this store and, as a
changelog record in the open transaction, to the changelog partition of the same number. The records are
what faust wrote (the key and the state as JSON, changelog `<app id>-features-<table>-changelog`), so
`modpipe chaos` and `features.offline` read them the same way.
"""

from __future__ import annotations

import time

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from features.events import TABLES
from modpipe import log
from modpipe.settings import Settings

_log = log.get(__name__)


def changelog_topic(app_id: str, table: str) -> str:
    return f"{app_id}-features-{table}-changelog"


def encode_key(key: str) -> bytes:
    return orjson.dumps(key)


def encode_value(value: dict) -> bytes:
    return orjson.dumps(value)


class Table:
    """One table's partitions held by this worker: {partition: {key: state dict}}."""

    def __init__(self, name: str, changelog: str):
        self.name, self.changelog = name, changelog
        self.partitions: dict[int, dict[str, dict]] = {}

    def get(self, key: str, partition: int) -> dict | None:
        return self.partitions.get(partition, {}).get(key)

    def set(self, key: str, value: dict, partition: int) -> None:
        self.partitions.setdefault(partition, {})[key] = value

    def drop(self, partition: int) -> None:
        self.partitions.pop(partition, None)

    def keys(self) -> int:
        return sum(len(p) for p in self.partitions.values())


def make_tables(app_id: str) -> dict[str, Table]:
    return {name: Table(name, changelog_topic(app_id, name)) for name in TABLES}


def restore(tables: list[Table], partitions: list[int], settings: Settings, bootstrap: str,
            timeout_s: float = 600.0) -> int:
    """Replace the given partitions of `tables` with what their changelogs hold (committed records only).
    Blocking; returns the records read."""
    if not tables or not partitions:
        return 0
    started = time.monotonic()
    by_topic = {t.changelog: t for t in tables}
    fresh: dict[tuple[str, int], dict] = {(t.changelog, p): {} for t in tables for p in partitions}
    conf = {**settings.kafka_client_config(), "bootstrap.servers": bootstrap, "group.id": f"{settings.app_id}-restore",
            "enable.auto.commit": False, "isolation.level": "read_committed", "enable.partition.eof": True,
            "auto.offset.reset": "earliest"}
    consumer = Consumer(conf)
    records = 0
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for topic, p in fresh])
        left = set(fresh)
        while left:
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"changelogs not read to their end within {timeout_s:.0f} s: {sorted(left)[:4]}")
            for m in consumer.consume(1000, 0.05):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        left.discard((m.topic(), m.partition()))
                        continue
                    if err.fatal() or err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise KafkaException(err)
                    _log.warning("changelog read error", extra={"error": str(err)})
                    continue
                states = fresh[(m.topic(), m.partition())]
                key = orjson.loads(m.key())
                if m.value() is None:
                    states.pop(key, None)
                else:
                    states[key] = orjson.loads(m.value())
                records += 1
    finally:
        consumer.close()
    for (topic, p), states in fresh.items():
        by_topic[topic].partitions[p] = states
    _log.info("tables restored", extra={"tables": sorted(by_topic), "partitions": sorted(partitions),
                                        "records": records, "seconds": round(time.monotonic() - started, 2)})
    return records
