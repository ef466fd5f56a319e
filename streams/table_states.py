"""A table's states in the worker's memory: decoded once, updated by many batches, written once per batch.

A hot key (a campaign's domain or link, a bot's account) costs one state encode and one changelog
record per batch instead of one per event, and its decoded state stays in memory between batches (a
bounded LRU), so the next batch does not decode it from the table again (Kafka Streams' record cache
does the same in front of its stores). The states hold the ids they counted (for exactness under
redelivery), so they are kilobytes: decoding them was most of a stage's logic.

The cache is only ever a copy of what this worker wrote to its own partitions: it is emptied whenever
partitions move (`invalidate`, on every rebalance), so a key that another worker updated in between is
read from the table again.

faust takes a table access's partition (the changelog partition of a write; with RocksDB, the
partition database of a read) from the *current event*, a context variable it sets while a stream is
iterated one event at a time. A batch handles many events, so `use_event` points it at the event in
hand; a key's single write goes out under the last event that changed it. Every event of a key comes
from the same partition, because each stage topic is partitioned like its tables.
"""

from __future__ import annotations

import collections
import functools
import weakref
from collections.abc import Callable
from typing import Any

from faust.serializers import codecs
from faust.stores.base import SerializedStore

# faust-streaming 0.15 (pinned): the context variable behind faust.streams.current_event(). faust has no
# public setter; tables read it in Collection.partition_for_key / _send_changelog and the RocksDB store.
from faust.streams import _current_event
from faust.types import TP

from features.state import Limits, load_state
from modpipe import log

_log = log.get(__name__)

DEFAULT_CACHED_KEYS = 20_000  # decoded states kept per table between batches


def use_event(event) -> None:
    """Make `event` faust's current event: table reads and writes below go to its partition."""
    _current_event.set(weakref.ref(event))


class ChangelogWriter:
    """Writes a faust table's value into its store and its changelog record through our outbox.

    `table[key] = value` would send the changelog record through faust's aiokafka producer, one
    buffered send per record (~90 us of Python each; at ~6 records per post faust's 100-record send
    buffer filled and stalled consumption). This writes what faust writes: the value into the table's
    store under the current event's partition, and the changelog record, serialised once with the
    table's own codecs, to that partition of the table's changelog topic, so faust's recovery and
    standbys read it as their own. The record holds the round's `Pending`, like every other output.
    Once records are delivered, `persist_offsets` moves the store's persisted changelog offset (what
    faust's `_on_changelog_sent` does per record), once per partition per delivery report.
    """

    def __init__(self, table, outbox):
        self.table, self.outbox = table, outbox
        self.topic = table.changelog_topic.get_topic_name()
        self.key_codec, self.value_codec = table.key_serializer, table.value_serializer
        self._delivered: dict[int, int] = {}  # partition -> highest delivered changelog offset, not yet persisted

    def __call__(self, key: str, value: dict, event, pending) -> None:
        store = self.table.data
        key_bytes, value_bytes = codecs.dumps(self.key_codec, key), codecs.dumps(self.value_codec, value)
        if isinstance(store, SerializedStore):  # RocksDB: the bytes the changelog carries, as recovery writes them
            store._set(key_bytes, value_bytes)
        else:  # the memory store keeps objects
            store[key] = value
        partition = event.message.partition
        self.outbox.produce(self.topic, value_bytes, key=key_bytes, partition=partition, pending=pending,
                            on_delivered=functools.partial(self._on_delivered, partition))

    def _on_delivered(self, partition: int, offset: int) -> None:
        if offset > self._delivered.get(partition, -1):
            self._delivered[partition] = offset

    def persist_offsets(self) -> None:
        for partition, offset in self._delivered.items():
            try:
                self.table.data.set_persisted_offset(TP(self.topic, partition), offset)
            except Exception as exc:  # noqa: BLE001 - e.g. the partition moved away meanwhile
                _log.debug("persisted offset not recorded", extra={"table": self.topic, "error": str(exc)})
        self._delivered.clear()


class TableStates:
    """States of one table's keys: cached across batches, changed keys written at `flush` (end of a batch)."""

    def __init__(self, table_name: str, table: Any, limits: Limits, cached_keys: int = DEFAULT_CACHED_KEYS,
                 write: Callable[[str, dict, Any, Any], None] | None = None):
        self.table_name, self.table, self.limits = table_name, table, limits
        self.cached_keys = cached_keys
        # write(key, value, event, pending); default: item assignment (a dict, or faust's own changelog send)
        self.write = write
        self._cache: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._ops: dict[str, list[tuple]] = {}  # key -> state operations done in this batch, in order
        self._dirty: dict[str, Any] = {}  # key -> last event that changed its state in this batch
        self._batch: dict[str, Any] = {}  # key -> state used in this batch (safe from eviction until flush)
        self.loads = 0  # states decoded from the table (cache misses)

    def state(self, key: str, event):
        """The key's state: from this batch, else from the cache, else decoded from the table."""
        use_event(event)
        state = self._batch.get(key)
        if state is not None:
            return state
        state = self._cache.get(key)
        if state is None:
            state = load_state(self.table_name, self.table.get(key), self.limits)
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
        use_event(event)
        state = load_state(self.table_name, self.table.get(key), self.limits)
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
            use_event(event)
            if self.write is None:
                self.table[key] = self._batch[key].to_dict()
            else:
                self.write(key, self._batch[key].to_dict(), event, pending)
        written = len(self._dirty)
        self._batch.clear()
        self._ops.clear()
        self._dirty.clear()
        return written

    def invalidate(self) -> None:
        """Partitions moved: forget every cached state (the next read decodes the table's value)."""
        self._cache.clear()
