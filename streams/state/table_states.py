"""A table's states in the worker's memory: decoded once, updated by many batches, written once per batch.

A hot key (a campaign's domain or link, a bot's account) costs one state encode and one changelog
record per batch instead of one per event, and its decoded state stays in memory between batches (a
bounded LRU), so the next batch does not decode it from the table again (Kafka Streams' record cache
does the same in front of its stores). The states hold the ids they counted (for exactness under
redelivery), so they are kilobytes: decoding them was most of a stage's logic.

The cache is only ever a copy of what this worker wrote to its own partitions: it is emptied whenever
partitions move (`invalidate`, on every rebalance), so a key that another worker updated in between is
read from the table again.

A key's state belongs to the table partition of the event in hand (`event.message.partition`: the stage
topic's partition, or its stand-in when an item is applied without the Kafka hop); every event of a key comes
from the same partition, because each stage topic is partitioned like its tables.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from features.state import Limits, load_state
from modpipe import log
from streams import metrics
from streams.state.tables import Table, encode_key

_log = log.get(__name__)

DEFAULT_CACHED_KEYS = 20_000  # decoded states kept per table between batches


class ChangelogWriter:
    """Reads and writes one table's states: a write goes into the table partition of the event it is made
    under and, as its changelog record, into the open transaction (holding the checkpoint's `Pending`)."""

    def __init__(self, table: Table, outbox):
        self.table, self.outbox = table, outbox
        # a key's whole state goes out at each checkpoint that changed it: a busy account's (up to ~100 KB
        # with its capped histories) dominates the changelog, so the bytes are counted, not only the records
        self._written_bytes = metrics.STATE_WRITTEN_BYTES.labels(table.name)

    def read(self, key: str, event) -> dict | None:
        return self.table.get(key, event.message.partition)

    def __call__(self, key: str, value: dict, event, pending) -> None:
        partition = event.message.partition
        data = self.table.set(key, value, partition)
        self._written_bytes.inc(len(data))
        self._produce(encode_key(key), data, partition, pending)

    def expire(self, pending) -> list[str]:
        """Forget the keys past the table's retention: a tombstone for each in the open transaction."""
        gone = self.table.expired()
        for partition, key in gone:
            self._produce(encode_key(key), None, partition, pending)
        return [key for _, key in gone]

    def _produce(self, key: bytes, data: bytes | None, partition: int, pending) -> None:
        delivered = self.table.delivered  # a RocksDB table keeps the changelog position its store reaches
        on_delivered = None if delivered is None else (
            lambda offset, key=key, data=data, partition=partition: delivered(partition, offset, key, data))
        self.outbox.produce(self.table.changelog, data, key=key, partition=partition, pending=pending,
                            on_delivered=on_delivered)


class TableStates:
    """States of one table's keys: cached across batches, changed keys written at `flush` (end of a batch)."""

    def __init__(self, table_name: str, table: Any, limits: Limits, cached_keys: int = DEFAULT_CACHED_KEYS,
                 write: Callable[[str, dict, Any, Any], None] | None = None,
                 read: Callable[[str, Any], dict | None] | None = None):
        self.table_name, self.table, self.limits = table_name, table, limits
        self.cached_keys = cached_keys
        # write(key, value, event, pending) and read(key, event); default: a dict's item assignment and get
        self.write = write
        self.read = read or (lambda key, event: table.get(key))
        self._cache: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._ops: dict[str, list[tuple]] = {}  # key -> state operations done in this batch, in order
        self._dirty: dict[str, Any] = {}  # key -> last event that changed its state in this batch
        self._batch: dict[str, Any] = {}  # key -> state used in this batch (safe from eviction until flush)
        self.loads = 0  # states decoded from the table (cache misses)

    def state(self, key: str, event):
        """The key's state: from this batch, else from the cache, else decoded from the table."""
        state = self._batch.get(key)
        if state is not None:
            return state
        state = self._cache.get(key)
        if state is None:
            state = load_state(self.table_name, self.read(key, event), self.limits)
            self.loads += 1
            self._cache[key] = state
            if len(self._cache) > self.cached_keys:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        self._batch[key] = state
        return state

    def done(self, key: str, event, op: tuple, changed: bool) -> None:
        """Record an operation applied to the key's state: ("apply", kind, ctx) or ("redecide", threshold)."""
        self._ops.setdefault(key, []).append(op)
        if changed:
            self._dirty[key] = event

    def rebuild(self, key: str, event) -> None:
        """An event failed half-way through the key's state: start again from the stored state and redo
        this batch's earlier operations on it, so the failed event leaves no trace and the others stay."""
        state = load_state(self.table_name, self.read(key, event), self.limits)
        for op in self._ops.get(key, []):
            if op[0] == "apply":
                state.apply(op[1], op[2])
            else:
                state.redecision(op[1])
        self._batch[key] = self._cache[key] = state

    def flush(self, pending=None) -> int:
        """Write every changed state once (its changelog record holding `pending`); returns the number of
        writes. Ends the batch."""
        for key, event in self._dirty.items():
            if self.write is None:
                self.table[key] = self._batch[key].to_dict()
            else:
                self.write(key, self._batch[key].to_dict(), event, pending)
        written = len(self._dirty)
        self._batch.clear()
        self._ops.clear()
        self._dirty.clear()
        return written

    def expire(self, pending=None) -> int:
        """Forget the keys the table's retention lets go (between batches: none of them is in use) and their
        cached states; returns how many."""
        expire = getattr(self.write, "expire", None)
        if expire is None:  # a plain dict table keeps its keys
            return 0
        gone = expire(pending)
        for key in gone:
            self._cache.pop(key, None)
        return len(gone)

    def invalidate(self) -> None:
        """Partitions moved: forget every cached state (the next read decodes the table's value)."""
        self._cache.clear()
