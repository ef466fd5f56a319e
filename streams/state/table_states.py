"""A table's states in the worker's memory: decoded once, updated by many batches, written once per batch.

A hot key (a campaign's domain or link, a bot's account) costs one state encode and one changelog
record per batch instead of one per event, and its decoded state stays in memory between batches (a
bounded LRU), so the next batch does not decode it from the table again (Kafka Streams' record cache
does the same in front of its stores). The states hold the ids they counted (for exactness under
redelivery), so they are kilobytes: decoding them was most of a stage's logic.

Memory. Decoded states are several times their encoding (Python objects, sets of ids: a user state ~2.4 KB
against 358 B of JSON, a domain's ~23 KB against 5.6 KB, measured with tracemalloc on `modpipe bench state`'s
stores), so both the cache and a checkpoint's batch are bounded by bytes, estimated from the encoded sizes
each flush writes (`decoded_bytes`, an over-estimate for every table). The cache evicts past its byte share;
the batch is bounded by the worker, which starts no round while the open checkpoint's states hold more than
theirs (`streams/runtime/runner.py`): a backlog of decisions' feedback once held ~67,000 decoded post states (~360 MB)
between two checkpoints.

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

from modpipe.features.state import Limits, load_state
from modpipe.streams import metrics
from modpipe.streams.state.tables import Table, encode_key

from modpipe import log

_log = log.get(__name__)

DEFAULT_CACHED_KEYS = 20_000  # decoded states kept per table between batches
DEFAULT_CACHE_BYTES = 64 * 1024 * 1024  # and their estimated bytes
# A decoded state's bytes from its encoding's: a fixed cost for its objects plus a multiple of its JSON, fitted
# over every table's states (tracemalloc: user 2.4 KB for 358 B, url 1.7 KB / 175 B, ip 1.1 KB / 137 B, post
# 5.4 KB / 2.0 KB, domain 23 KB / 5.6 KB) and above each (tests/unit/test_state_table_states.py checks it).
STATE_BASE_BYTES, STATE_BYTES_PER_ENCODED = 1_200, 5.0
NEW_STATE_BYTES = 4_096  # the estimate before a table's first write


def decoded_bytes(encoded_len: int) -> int:
    """Estimated bytes of a decoded state whose encoding is `encoded_len` bytes long."""
    return int(STATE_BASE_BYTES + STATE_BYTES_PER_ENCODED * encoded_len)


class ChangelogWriter:
    """Reads and writes one table's states: a write goes into the table partition of the event it is made
    under and, as its changelog record, into the open transaction (holding the checkpoint's `Pending`)."""

    def __init__(self, table: Table, outbox, ends=None):
        self.table, self.outbox = table, outbox
        self.ends = ends  # streams/state/ends.py: where the open checkpoint's records of each partition end
        # a key's whole state goes out at each checkpoint that changed it: a busy account's (up to ~100 KB
        # with its capped histories) dominates the changelog, so the bytes are counted, not only the records
        self._written_bytes = metrics.STATE_WRITTEN_BYTES.labels(table.name)

    def read(self, key: str, event) -> dict | None:
        return self.table.get(key, event.message.partition)

    def __call__(self, key: str, value: dict, event, pending) -> int:
        """Write the state; returns its encoded size."""
        partition = event.message.partition
        data = self.table.set(key, value, partition)
        self._written_bytes.inc(len(data))
        self.produce(encode_key(key), data, partition, pending)
        return len(data)

    def expire(self, pending) -> list[str]:
        """Forget the keys past the table's retention: a tombstone for each in the open transaction."""
        gone = self.table.expired()
        for partition, key in gone:
            self.produce(encode_key(key), None, partition, pending)
        return [key for _, key in gone]

    def produce(self, key: bytes, data: bytes | None, partition: int, pending) -> None:
        delivered = self.table.delivered  # a RocksDB table keeps the changelog position its store reaches
        ends, name = self.ends, self.table.name

        def on_delivered(offset: int) -> None:
            if delivered is not None:
                delivered(partition, offset, key, data)
            if ends is not None:
                ends.delivered(name, partition, offset)
        self.outbox.produce(self.table.changelog, data, key=key, partition=partition, pending=pending,
                            on_delivered=on_delivered)


class TableStates:
    """States of one table's keys: cached across batches, changed keys written at `flush` (end of a batch)."""

    def __init__(self, table_name: str, table: Any, limits: Limits, cached_keys: int = DEFAULT_CACHED_KEYS,
                 write: Callable[[str, dict, Any, Any], int | None] | None = None,
                 read: Callable[[str, Any], dict | None] | None = None, cache_bytes: int = DEFAULT_CACHE_BYTES):
        self.table_name, self.table, self.limits = table_name, table, limits
        self.cached_keys, self.cache_bytes = cached_keys, cache_bytes
        # estimated bytes of one decoded state of this table: the mean over the states the last flush wrote
        self.state_bytes = NEW_STATE_BYTES
        # write(key, value, event, pending) and read(key, event); default: a dict's item assignment and get
        self.write = write
        self.read = read or (lambda key, event: table.get(key))
        self._cache: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._ops: dict[str, list[tuple]] = {}  # key -> state operations done in this batch, in order
        self._dirty: dict[str, Any] = {}  # key -> last event that changed its state in this batch
        self._batch: dict[str, Any] = {}  # key -> state used in this batch (safe from eviction until flush)
        self.loads = 0  # states decoded from the table (cache misses)
        # the gauges' labelled children looked up once (`labels()` takes a lock and builds its key), set every flush
        self._gauges = [(held, metrics.TABLE_STATES.labels(table_name, held), metrics.TABLE_STATE_BYTES.labels(
            table_name, held)) for held in ("batch", "cached")]

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
            if len(self._cache) > self.cached_max:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        self._batch[key] = state
        return state

    @property
    def cached_max(self) -> int:
        """States the cache keeps: its key count or its bytes, whichever is reached first."""
        return max(1, min(self.cached_keys, self.cache_bytes // self.state_bytes))

    @property
    def batch_bytes(self) -> int:
        """Estimated bytes of the states used since the last flush (held until the next)."""
        return len(self._batch) * self.state_bytes

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
        encoded = 0
        for key, event in self._dirty.items():
            if self.write is None:
                self.table[key] = self._batch[key].to_dict()
            else:
                encoded += self.write(key, self._batch[key].to_dict(), event, pending) or 0
        written = len(self._dirty)
        if written and encoded:
            self.state_bytes = decoded_bytes(encoded // written)
            while len(self._cache) > self.cached_max:
                self._cache.popitem(last=False)
        for held, states, states_bytes in self._gauges:
            n = len(self._batch) if held == "batch" else len(self._cache)
            states.set(n)
            states_bytes.set(n * self.state_bytes)
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
