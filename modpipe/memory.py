"""A worker's memory budget, and the byte-bounded caches that respect it.

What users post reaches caches and buffers (parsed links, IPs, timestamps, text probabilities, bundles, the
decision queue). Bounded by count, a cache of hostile entries (4,000-character emoji links, ~110 KB parsed)
outgrows any pod, so each is bounded by bytes instead: its share of MODPIPE_WORKER_MEMORY_MB (`SHARES`), the
memory the pod's limit gives the worker. The rest of the budget is the process itself (~400 MiB: Python,
numpy, the models, librdkafka) and the feature tables (bounded by their retentions, docs/features.md).

`ByteLRU` charges each entry `approx_size(key) + approx_size(value) + ENTRY_OVERHEAD`, an over-estimate of what
tracemalloc sees it allocate (tests/unit/test_memory.py checks both directions on real entries). Sizes are
taken on the worker's hot path (every cache miss, every queued post), so `approx_size` walks JSON-like values
with C-level passes over flat containers; a cache hit takes no lock. Pure: no Kafka, no metrics;
streams/metrics.py reads `CACHES` when it is scraped.
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import sys
import threading
from collections.abc import Callable, Hashable
from typing import Any

DEFAULT_WORKER_MEMORY_MB = 2048

# Fraction of MODPIPE_WORKER_MEMORY_MB each use may hold (docs/features.md, Memory budget). 45 % in all;
# the rest is the process (~400 MiB: Python, numpy, LightGBM, librdkafka) and, with
# MODPIPE_STATE_BACKEND=memory, the tables.
SHARES: dict[str, float] = {
    "url_parse": 0.02,  # modpipe.features.url.parse_url: parsed links (~2 KB each; a hostile one ~110 KB)
    "brand_match": 0.005,  # modpipe.features.brands: look-alike matches per host
    "ip_parse": 0.005,  # modpipe.schema.canonical_ip
    "ip_normalize": 0.005,  # modpipe.features.events.normalize_ip
    "timestamp_parse": 0.005,  # modpipe.schema timestamps
    "journey_step": 0.002,  # modpipe.features.journey step names
    "partition": 0.01,  # modpipe.streams.moderation.bundles.partition_for
    "text": 0.01,  # modpipe.streams.moderation.scoring.TextCache: probabilities per model input
    "bundles": 0.02,  # one round's stage bundles before they are produced
    "fetched": 0.02,  # records fetched and waiting for their rounds (fetching pauses above it)
    "decision_queue": 0.03,  # ready posts waiting for a Triton batch (fetching pauses above it)
    "producer_queue": 0.03,  # librdkafka's queue of produced records not yet delivered
    "table_store": 0.08,  # streams/state/rocksdb.py: RocksDB's block cache and memtables, all tables
    "state_cache": 0.08,  # streams/state/table_states.py: decoded states kept between checkpoints, split by table
    "checkpoint_states": 0.10,  # the decoded states used since the last checkpoint (rounds wait above it)
    "next_epoch": 0.03,  # records held back for the next transaction while a checkpoint commits (the same)
}
MIB = 1024 * 1024

# What a cache entry costs beyond its key and value: the OrderedDict's hash slot and linked-list node, and the
# (value, size) pair (measured ~150 B on CPython 3.11; rounded up).
ENTRY_OVERHEAD = 200

_ATOMS = (int, float, bool, complex, type(None))


def deep_size(obj: Any, _seen: set[int] | None = None) -> int:
    """Bytes `obj` holds: sys.getsizeof of it and, recursively, of what it contains (containers, dataclasses,
    objects with __dict__ or __slots__, dataclasses among them), each object once. Conservative: shared objects (interned strings,
    small ints) are counted as if the entry owned them."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, (str, bytes, bytearray, *_ATOMS)):
        return size
    if isinstance(obj, dict):
        return size + sum(deep_size(k, seen) + deep_size(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        return size + sum(deep_size(x, seen) for x in obj)
    if hasattr(obj, "__dict__"):
        size += deep_size(vars(obj), seen)
    for name in getattr(type(obj), "__slots__", ()):
        if hasattr(obj, name):
            size += deep_size(getattr(obj, name), seen)
    return size


_getsizeof = sys.getsizeof
_LEAF_TYPES = frozenset((str, bytes, int, float, bool, type(None)))
# What a JSON scalar takes, without calling sys.getsizeof on each (~120 ns a call, most of a feature map's
# sizing): an int within 64 bits (orjson reads larger ones as floats) at most getsizeof(2**64); a str of n
# characters ASCII_BASE + n when it is ASCII, else at most WIDE_BASE + 4n (four bytes a character).
_SCALAR_BYTES = {int: _getsizeof(2 ** 64), float: _getsizeof(0.0), bool: _getsizeof(True),
                 type(None): _getsizeof(None), str: 0, bytes: 0}
_INT_LIMIT = 2 ** 64
_SMALL = 8
_ASCII_BASE = _getsizeof("")
_WIDE_BASE = _getsizeof("\U0001f600") - 4
_is_str = functools.partial(operator.is_, str)
_is_int = functools.partial(operator.is_, int)
_is_bytes = functools.partial(operator.is_, bytes)


def _leaves_size(items: Any) -> int | None:
    """What the JSON scalars `items` (a list, tuple or dict view) take, in C-level passes; None when one of them
    is not a scalar (or an int beyond 64 bits)."""
    types = list(map(type, items))
    if types.count(str) == len(types):  # a dict's keys, most often: only the strings' lengths
        chars = sum(map(len, items))
        return len(types) * _ASCII_BASE + chars if all(map(str.isascii, items)) \
            else len(types) * _WIDE_BASE + 4 * chars
    if not _LEAF_TYPES.issuperset(types):
        return None
    size = sum(map(_SCALAR_BYTES.__getitem__, types))
    if str in types:
        strs = list(itertools.compress(items, map(_is_str, types)))
        chars = sum(map(len, strs))
        size += len(strs) * _ASCII_BASE + chars if all(map(str.isascii, strs)) \
            else len(strs) * _WIDE_BASE + 4 * chars
    if int in types and max(map(abs, itertools.compress(items, map(_is_int, types)))) >= _INT_LIMIT:
        return None
    if bytes in types:
        size += sum(map(_getsizeof, itertools.compress(items, map(_is_bytes, types))))
    return size


# The most a JSON scalar of a decoded record or a feature map takes: an int below 2**90 (a 64-bit value, or a sum
# of at most a thousand of them), a float, a bool or None. Schema-aware sizes (`schema.post_size`,
# `modpipe.features.vector.features_size`) charge each scalar field this much without looking at it.
SCALAR_BOUND = _getsizeof(2 ** 89)


def str_size(s: str) -> int:
    """What `approx_size` charges a string."""
    return _ASCII_BASE + len(s) if s.isascii() else _WIDE_BASE + 4 * len(s)


def strs_size(strs: list[str]) -> int:
    """What `approx_size` charges the strings of `strs` (a list of str), in C-level passes."""
    chars = sum(map(len, strs))
    return len(strs) * _ASCII_BASE + chars if all(map(str.isascii, strs)) else len(strs) * _WIDE_BASE + 4 * chars


def approx_size(obj: Any) -> int:
    """At least `deep_size` of a JSON-like value (dicts, lists and tuples of strings, bytes, numbers, None), in
    a few C-level passes where `deep_size` visits each object in Python: an object shared within `obj` is
    counted each time it occurs, a non-ASCII string as four bytes a character, an int as a 64-bit one (a feature
    map: ~5 us where `deep_size` takes ~50). Anything else is handed to `deep_size`."""
    kind = type(obj)
    if kind is str:
        return _ASCII_BASE + len(obj) if obj.isascii() else _WIDE_BASE + 4 * len(obj)
    if kind in _LEAF_TYPES:
        return _getsizeof(obj)
    if kind is dict:
        parts = (obj.keys(), obj.values())
    elif kind is list or kind is tuple:
        parts = (obj,)
    else:
        return deep_size(obj)
    size = _getsizeof(obj)
    if len(obj) <= _SMALL:  # a few items: one Python pass costs less than the C passes' set-up
        for items in parts:
            for item in items:
                kind = type(item)
                if kind is str:
                    size += _ASCII_BASE + len(item) if item.isascii() else _WIDE_BASE + 4 * len(item)
                elif kind is float or kind is bool or item is None:
                    size += _SCALAR_BYTES[kind]
                else:
                    size += approx_size(item)
        return size
    for items in parts:
        leaves = _leaves_size(items)
        if leaves is None:  # nested containers (or other objects) among them: one at a time
            leaves = sum(map(approx_size, items))
        size += leaves
    return size


def record_entry_size(key: Any, value: Any) -> int:
    """A cache entry whose value is a record object (a dataclass instance) of JSON-like fields: at least
    `deep_size` of both, with its fields measured by `approx_size` (a parsed link in ~1/10 of deep_size's time)."""
    return approx_size(key) + _getsizeof(value) + approx_size(vars(value))


def budget_bytes(use: str, worker_memory_mb: float) -> int:
    return int(SHARES[use] * worker_memory_mb * MIB)


class ByteLRU:
    """Least recently used entries evicted once the entries' charged bytes exceed `max_bytes`. An entry
    larger than the whole cache is not kept. Thread-safe: changes take a lock; `get` takes none (each
    OrderedDict call is atomic under the GIL, and an entry evicted between its two calls reads as a miss)."""

    def __init__(self, name: str, max_bytes: int, size: Callable[[Any, Any], int] | None = None,
                 max_entries: int | None = None):
        self.name = name
        self.max_bytes = max_bytes
        self.max_entries = max_entries  # an optional count limit as well (None: bytes only)
        self._size = size or (lambda key, value: approx_size(key) + approx_size(value))
        self._items: collections.OrderedDict[Hashable, tuple[Any, int]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def get(self, key: Hashable, default: Any = None) -> Any:
        try:
            value = self._items[key][0]
            self._items.move_to_end(key)
        except KeyError:
            self.misses += 1
            return default
        self.hits += 1
        return value

    def put(self, key: Hashable, value: Any) -> None:
        size = self._size(key, value) + ENTRY_OVERHEAD
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            if size > self.max_bytes or self.max_entries == 0:
                return
            self._items[key] = (value, size)
            self.bytes += size
            self._shrink()

    def resize(self, max_bytes: int, max_entries: int | None = None) -> None:
        with self._lock:
            self.max_bytes, self.max_entries = max_bytes, max_entries
            self._shrink()

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.bytes = 0

    def keys(self) -> list:
        """Keys from the least to the most recently used."""
        with self._lock:
            return list(self._items)

    def _shrink(self) -> None:
        while self._items and (self.bytes > self.max_bytes or
                               (self.max_entries is not None and len(self._items) > self.max_entries)):
            _, (_, size) = self._items.popitem(last=False)
            self.bytes -= size
            self.evictions += 1


# Every cache fed by platform data, by name: streams/metrics.py exports their bytes, `apply_budget` sizes them.
CACHES: dict[str, ByteLRU] = {}


def register(cache: ByteLRU) -> ByteLRU:
    CACHES[cache.name] = cache  # a newer cache of the same name (a new TextScorer) replaces the old one
    return cache


def cached(name: str, size: Callable[[Any, Any], int] | None = None):
    """Decorator: memoise a function of hashable arguments in a registered `ByteLRU` (`fn.cache`) sized by
    its share of the default budget until `apply_budget` sizes it for the worker's."""
    def wrap(fn):
        cache = register(ByteLRU(name, budget_bytes(name, DEFAULT_WORKER_MEMORY_MB), size))
        items = cache._items  # the hit path inlined: these run several times per record

        @functools.wraps(fn)
        def call(*args):
            key = args[0] if len(args) == 1 else args
            try:
                value = items[key][0]
                items.move_to_end(key)
            except KeyError:
                cache.misses += 1
                value = fn(*args)
                cache.put(key, value)
                return value
            cache.hits += 1
            return value

        call.cache = cache
        return call

    return wrap


def apply_budget(worker_memory_mb: float) -> dict[str, int]:
    """Size every registered cache by its share of `worker_memory_mb`; returns each use's budget in bytes."""
    budgets = {use: budget_bytes(use, worker_memory_mb) for use in SHARES}
    for name, cache in CACHES.items():
        cache.resize(budgets[name], cache.max_entries)
    return budgets
