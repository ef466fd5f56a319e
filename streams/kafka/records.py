"""What the consumer hands the wiring: a record of an input partition, with its position."""

from __future__ import annotations

from typing import NamedTuple


class TP(NamedTuple):
    """A topic partition."""
    topic: str
    partition: int


class Record:
    """One consumed record. `message` is the record itself: the wiring reads `event.message.topic` etc. of
    records and of stand-ins for a stage partition alike (`agents.PartitionEvent`)."""

    __slots__ = ("topic", "partition", "offset", "key", "value", "timestamp_ms", "tp")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                 timestamp_ms: int | None = None):
        self.topic, self.partition, self.offset = topic, partition, offset
        self.key, self.value, self.timestamp_ms = key, value, timestamp_ms
        self.tp = TP(topic, partition)

    @property
    def message(self) -> Record:
        return self

    def __repr__(self) -> str:
        return f"Record({self.topic}[{self.partition}]@{self.offset})"


RECORD_OVERHEAD = 300  # a Record beside its key and value: the object, its TP, the bytes objects' headers


def records_bytes(records: list[Record]) -> int:
    """What a batch of records holds in memory (the fetched buffer's unit)."""
    return sum(RECORD_OVERHEAD + len(r.value or b"") + len(r.key or b"") for r in records)
