"""Stage topics carry bundles: one record per destination partition per round, holding many items.

A stage's table is co-partitioned with its stage topic: every item for a key must land on the
partition of that key, and faust writes the table's changelog to the partition of the event in hand.
So the bundler places each item itself, with the same murmur2 hash Kafka's Java client (and aiokafka,
faust's client) uses for keyed records, and a bundle only ever holds items of one partition. One
bundle record per partition per round replaces one record per item: faust's per-record machinery,
a produce and a fetch entry are paid once per bundle, and the broker stores a few large records
instead of many small ones.

Record value: `{"items": [item, ...]}` (orjson). An item is `{"kind", "ctx", "to": [[table, key], ...]}`
plus, for a post on its way through the stages, `"post"` (the validated post), `"received_at_ms"`,
`"counts"` (features gathered so far) and `"route"` (the hops still ahead).
"""

from __future__ import annotations

import functools

import orjson
from aiokafka.partitioner import murmur2

MAX_BUNDLE_BYTES = 512 * 1024  # well under Kafka's default 1 MB record limit


@functools.lru_cache(maxsize=200_000)
def partition_for(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2, Java client, aiokafka) gives a record keyed `key`."""
    return (murmur2(key.encode("utf-8", "surrogatepass")) & 0x7FFFFFFF) % partitions


def encode_bundle(items: list[dict]) -> bytes:
    return orjson.dumps({"items": items})


def decode_bundle(value: bytes) -> list[dict]:
    obj = orjson.loads(value)
    items = obj.get("items") if isinstance(obj, dict) else None
    if not isinstance(items, list):
        raise ValueError("not a bundle: expected {\"items\": [...]}")
    return items


class Bundler:
    """Items collected per (topic, partition) during one round, then produced as bundle records."""

    def __init__(self, partitions: int):
        self.partitions = partitions
        self._items: dict[tuple[str, int], list[bytes]] = {}
        self.items = 0

    def add(self, topic: str, partition_key: str, item: dict) -> None:
        where = (topic, partition_for(partition_key, self.partitions))
        self._items.setdefault(where, []).append(orjson.dumps(item))
        self.items += 1

    def __bool__(self) -> bool:
        return bool(self._items)

    def records(self):
        """(topic, partition, value, items) of each bundle; a destination with too much for one record gets
        several. Empties the bundler."""
        for (topic, partition), encoded in self._items.items():
            chunk: list[bytes] = []
            size = 0
            for item in encoded:
                if chunk and size + len(item) > MAX_BUNDLE_BYTES:
                    yield topic, partition, _join(chunk), len(chunk)
                    chunk, size = [], 0
                chunk.append(item)
                size += len(item) + 1
            yield topic, partition, _join(chunk), len(chunk)
        self._items.clear()
        self.items = 0


def _join(encoded_items: list[bytes]) -> bytes:
    # Items are encoded once, when added; the record is assembled from their bytes.
    return b'{"items":[' + b",".join(encoded_items) + b"]}"
