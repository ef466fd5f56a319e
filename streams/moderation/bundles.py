"""Stage topics carry bundles: one record per destination partition per round, holding many items.

A stage's table is co-partitioned with its stage topic: every item for a key must land on the partition of
that key, and a table's state is written under the partition of the record in hand (streams/state/table_states.py).
So the bundler places each item itself, with the murmur2 hash that Kafka's Java client (and librdkafka's
`murmur2_random` partitioner, which loadgen's producers use) applies to keyed records, and a bundle only ever
holds items of one partition. One bundle record per partition per round replaces one record per item: a
produce and a fetch entry are paid once per bundle, and the broker stores a few large records instead of many
small ones.

Record value: `{"items": [item, ...]}` (orjson). An item is `{"kind", "ctx", "to": [[table, key], ...]}`
plus, for a post on its way through the stages, `"post"` (the validated post), `"received_at_ms"`,
`"counts"` (features gathered so far) and `"route"` (the hops still ahead); `"check": true` on a post on its way to
the post table to ask whether its id is new (its first table could not tell: stages.py).

A round's bundler holds at most its share of MODPIPE_WORKER_MEMORY_MB (modpipe/memory.py): past it, what it
holds is produced there and then (`on_full`), into the round's own transaction, and it starts empty; a
partition's items keep their order, only in more records.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Callable

import orjson
from modpipe.streams import metrics

from modpipe import memory

MAX_BUNDLE_BYTES = 512 * 1024  # well under Kafka's default 1 MB record limit

_SEED = 0x9747B28C
_M = 0x5BD1E995  # murmur2's mixing constant
_MASK = 0xFFFFFFFF
_WORD = struct.Struct("<I")  # the Java client reads each 4-byte block little-endian


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash (the Java client's `Utils.murmur2`, seed 0x9747b28c): a signed 32-bit int, as Java
    returns it. Java's 32-bit int arithmetic is done here on Python ints masked to 32 bits."""
    length = len(data)
    h = _SEED ^ length
    end = length & ~3
    if end:
        for (k,) in _WORD.iter_unpack(data[:end]):
            k = (k * _M) & _MASK
            k = ((k ^ (k >> 24)) * _M) & _MASK
            h = ((h * _M) & _MASK) ^ k
    if length & 3:  # the last 1 to 3 bytes, little-endian: Java's switch that falls through cases 3, 2, 1
        h = ((h ^ int.from_bytes(data[end:], "little")) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - 0x100000000 if h & 0x80000000 else h


# An entry: a (key, partitions) tuple and the partition number. Charged from the key's length (every new post id
# is a miss: walking the tuple cost more than the hash).
_ENTRY_FIXED = sys.getsizeof(("", 0)) + 2 * memory.SCALAR_BOUND


def _entry_size(key: tuple[str, int], value: int) -> int:
    return _ENTRY_FIXED + memory.str_size(key[0])


@memory.cached("partition", size=_entry_size)
def partition_for(key: str, partitions: int) -> int:
    """The partition Kafka's default partitioner (murmur2: Java client; librdkafka `murmur2_random`) gives a
    record keyed `key`."""
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

    def __init__(self, partitions: int, max_bytes: int | None = None,
                 on_full: Callable[[Bundler], None] | None = None):
        self.partitions = partitions
        self.max_bytes = memory.budget_bytes("bundles", memory.DEFAULT_WORKER_MEMORY_MB) \
            if max_bytes is None else max_bytes
        self.on_full = on_full  # produces what the bundler holds (emptying it); None: it only grows
        self._items: dict[tuple[str, int], list[bytes]] = {}
        self.items = 0
        self.bytes = 0  # the encoded items as they sit in memory, with their list slots

    def add(self, topic: str, partition_key: str, item: dict) -> None:
        where = (topic, partition_for(partition_key, self.partitions))
        encoded = orjson.dumps(item)
        self._items.setdefault(where, []).append(encoded)
        self.items += 1
        self.bytes += sys.getsizeof(encoded) + 8
        if self.on_full is not None and self.bytes > self.max_bytes:
            self.on_full(self)

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
        metrics.BUFFER_BYTES.labels("bundles").set(self.bytes)
        self._items.clear()
        self.items = 0
        self.bytes = 0


def _join(encoded_items: list[bytes]) -> bytes:
    # Items are encoded once, when added; the record is assembled from their bytes.
    return b'{"items":[' + b",".join(encoded_items) + b"]}"
