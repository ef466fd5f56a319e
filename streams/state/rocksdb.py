"""Feature tables on disk: each table partition in a RocksDB of its own (`rocksdict`), as Quix Streams'
`state/rocksdb/` keeps a store partition, with a bounded memory in front of it.

Memory. What a table holds in memory is bounded by bytes, not by its retention: RocksDB's block cache and
memtables share one LRU cache of the worker's `table_store` share of MODPIPE_WORKER_MEMORY_MB
(modpipe/memory.py), and a stage's decoded states stay in `table_states.TableStates`' LRU between batches. The
rest is on disk.

Exactness. A partition's store is written after the Kafka transaction that carried its changelog records
committed (`committed`, from the checkpoint), never before: until then a checkpoint's writes are held in
memory (`_staged`, read before the store). With each write goes, in the same RocksDB write batch, the offset
of the last changelog record it holds and a check of that record (a CRC of its key and value). At an
assignment, `tables.restore` reads each changelog partition from that offset, not from its start: the record
found there must be the one the store remembers, else the store is not a prefix of the committed changelog
(the changelog was deleted or truncated, the transaction was lost after all, the store was copied from
elsewhere) and is wiped and restored from the start. Quix Streams refuses to start on an offset past the
changelog's end and asks for the store to be cleared by hand; this restores it. A crash between the commit
and the store write leaves the store behind the changelog: the tail read brings it level.

Retention. Beside each key's row (`d` + key: write time + state) the store keeps a time index (`t` + write
time + key), so `expired` reads the oldest keys first without a scan, and a floor (at or below the oldest row's
write time) answers a cutoff below it without an iterator: every checkpoint asks every partition of every table.

A revoked partition's store is closed and kept on disk; the next assignment opens it again and reads only the
changelog's tail.
"""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import orjson
import rocksdict
from modpipe.features.events import TABLES
from modpipe.streams.state.tables import _wall_ms, changelog_topic, encode_key, encode_value, record_check

from modpipe import log

_log = log.get(__name__)

DATA, TIME, META = b"d", b"t", b"m"
_TS = struct.Struct(">Q")  # big-endian: the time index sorts by write time
META_KEY = META + b"changelog"
WRITE_BUFFER_BYTES = 4 * 1024 * 1024  # per partition store; all of them are charged to the shared cache
RESTORE_CHUNK = 5_000  # changelog records applied to a store per write batch during a restore
NO_ROWS_MS = 2**63 - 1  # the floor of a store without rows: any write lowers it


class Resources:
    """The block cache and write-buffer manager every partition store of a worker shares."""

    def __init__(self, cache_bytes: int):
        self.cache_bytes = cache_bytes
        self.cache = rocksdict.Cache(cache_bytes)
        # memtables are charged to the same cache: one limit for both (RocksDB's Write-Buffer-Manager)
        self.write_buffers = rocksdict.WriteBufferManager.new_write_buffer_manager_with_cache(
            max(cache_bytes // 2, WRITE_BUFFER_BYTES), False, self.cache)

    def options(self) -> rocksdict.Options:
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(WRITE_BUFFER_BYTES)
        opts.set_max_write_buffer_number(2)
        opts.set_write_buffer_manager(self.write_buffers)
        opts.set_compression_type(rocksdict.DBCompressionType.lz4())  # JSON states: ~3x smaller on disk
        opts.set_max_open_files(64)
        opts.set_keep_log_file_num(2)
        opts.set_max_background_jobs(2)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(self.cache)
        table.set_bloom_filter(10, False)  # most reads of a new key find nothing: the filter answers them
        table.set_cache_index_and_filter_blocks(True)  # bounded by the cache, not by the data
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        opts.set_block_based_table_factory(table)
        return opts


class PartitionStore:
    """One table partition's RocksDB: rows, their time index, and the changelog position they hold."""

    def __init__(self, path: Path, resources: Resources):
        self.path, self.resources = path, resources
        self.db: rocksdict.Rdict | None = None
        self.open()

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # at or below the oldest row's write time (None: not known yet): `oldest` answers a cutoff below it
        # without an iterator, which every checkpoint would otherwise open on every partition of every table
        self.floor_ms: int | None = None
        self.db = rocksdict.Rdict(str(self.path), self.resources.options())
        meta = self.db.get(META_KEY)
        self.meta = orjson.loads(meta) if meta is not None else {"offset": None, "check": 0, "keys": 0, "bytes": 0}

    @property
    def offset(self) -> int | None:
        """The changelog offset of the last record this store holds (None: it holds none)."""
        return self.meta["offset"]

    def get(self, key: bytes) -> tuple[bytes, int] | None:
        row = self.db.get(DATA + key)
        return None if row is None else (row[8:], _TS.unpack_from(row)[0])

    def write(self, rows: dict[bytes, tuple[bytes, int] | None], offset: int | None, check: int) -> None:
        """Apply `rows` (key -> (state, written at ms), or None: forget the key) and the changelog position they
        reach, in one atomic write batch."""
        batch = rocksdict.WriteBatch(raw_mode=True)
        keys, size = self.meta["keys"], self.meta["bytes"]
        for key, row in rows.items():
            old = self.db.get(DATA + key)
            if old is not None:
                batch.delete(TIME + old[:8] + key)
                keys -= 1
                size -= len(old) - 8
            if row is None:
                if old is not None:
                    batch.delete(DATA + key)
                continue
            data, at_ms = row
            if self.floor_ms is not None and at_ms < self.floor_ms:
                self.floor_ms = max(at_ms, 0)
            ts = _TS.pack(max(at_ms, 0))
            batch.put(DATA + key, ts + data)
            batch.put(TIME + ts + key, b"")
            keys += 1
            size += len(data)
        if offset is not None:
            self.meta = {"offset": offset, "check": check, "keys": keys, "bytes": size}
        else:
            self.meta = {**self.meta, "keys": keys, "bytes": size}
        batch.put(META_KEY, orjson.dumps(self.meta))
        self.db.write(batch)

    def oldest(self, limit: int | None = None, before_ms: int | None = None) -> list[tuple[int, bytes]]:
        """(written at ms, key) of the oldest keys, oldest first: at most `limit`, only those written at or
        before `before_ms`."""
        if before_ms is not None and self.floor_ms is not None and before_ms < self.floor_ms:
            return []
        out = []
        it = self.db.iter()
        it.seek(TIME)
        first = True
        while it.valid():
            k = it.key()
            if not k.startswith(TIME):
                break
            at_ms = _TS.unpack_from(k, 1)[0]
            if first:  # the oldest row: nothing is older until a write brings one
                self.floor_ms, first = at_ms, False
            if before_ms is not None and at_ms > before_ms:
                break
            out.append((at_ms, k[9:]))
            if limit is not None and len(out) >= limit:
                break
            it.next()
        del it
        if first:  # no rows at all
            self.floor_ms = NO_ROWS_MS
        return out

    def items(self):
        """(key, state, written at ms) of every row (tests, the bench)."""
        it = self.db.iter()
        it.seek(DATA)
        while it.valid() and it.key().startswith(DATA):
            row = it.value()
            yield it.key()[1:], row[8:], _TS.unpack_from(row)[0]
            it.next()
        del it

    def wipe(self) -> None:
        """Forget everything (the store is not a prefix of the changelog): a fresh, empty store."""
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)
        self.open()

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None


def disk_bytes(root: Path) -> int:
    """Bytes of the files under `root` (the stores' size on disk)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


class RocksTable:
    """One table's partitions on this worker, each in its own RocksDB under `root` (`root/<partition>`); the
    same interface as `tables.Table`, plus `delivered` and `committed` (the checkpoint's hooks)."""

    backend = "rocksdb"

    def __init__(self, name: str, changelog: str, root: Path, resources: Resources, retention_ms: int = 0,
                 clock=_wall_ms):
        self.name, self.changelog, self.root, self.resources = name, changelog, root, resources
        self.retention_ms = retention_ms  # 0: keys are kept for ever
        self.clock = clock
        self.partitions: dict[int, PartitionStore] = {}  # open stores: the partitions this worker owns
        # a checkpoint's writes until its transaction commits: partition -> key -> (state, at ms) or None
        self._staged: dict[int, dict[bytes, tuple[bytes, int] | None]] = {}
        self._last: dict[int, tuple[int, bytes, bytes | None]] = {}  # partition -> its last delivered record
        # a restore's partitions until `restore_end` installs them: it may read on another thread while the loop
        # works on `partitions`, which it must not change meanwhile (expiry and the gauges iterate them)
        self._opening: dict[int, PartitionStore] = {}
        self._restoring: dict[int, dict[bytes, tuple[bytes, int] | None]] = {}
        self._restored_to: dict[int, tuple[int, int]] = {}

    # -- the partitions
    def store(self, partition: int) -> PartitionStore:
        store = self.partitions.get(partition)
        if store is None:
            store = self.partitions[partition] = PartitionStore(self.root / str(partition), self.resources)
        return store

    def drop(self, partition: int) -> None:
        """The partition was revoked: its store is closed and kept (the next assignment reads only the tail)."""
        store = self.partitions.pop(partition, None)
        self._staged.pop(partition, None)
        self._last.pop(partition, None)
        if store is not None:
            store.close()

    def close(self) -> None:
        for p in list(self.partitions):
            self.drop(p)

    # -- reads and writes
    def _row(self, key: bytes, partition: int) -> tuple[bytes, int] | None:
        staged = self._staged.get(partition)
        if staged is not None and key in staged:
            return staged[key]
        store = self.partitions.get(partition)
        return None if store is None else store.get(key)

    def get(self, key: str, partition: int) -> dict | None:
        row = self._row(encode_key(key), partition)
        return None if row is None else orjson.loads(row[0])

    def set(self, key: str, value: dict, partition: int) -> bytes:
        data = encode_value(value)
        self.put(key, data, partition, self.clock())
        return data

    def put(self, key: str, data: bytes, partition: int, written_at_ms: int) -> None:
        self._staged.setdefault(partition, {})[encode_key(key)] = (data, written_at_ms)

    def delivered(self, partition: int, offset: int, key: bytes, value: bytes | None) -> None:
        """A changelog record of the open checkpoint was delivered at `offset`."""
        last = self._last.get(partition)
        if last is None or offset > last[0]:
            self._last[partition] = (offset, key, value)  # checked at the commit: only the last one is kept

    def committed(self) -> None:
        """The transaction holding the staged writes committed: they go to the stores, with the changelog
        position they reach."""
        for partition, rows in self._staged.items():
            store = self.partitions.get(partition)
            if store is None or not rows and partition not in self._last:  # nothing of it in this checkpoint
                continue
            last = self._last.get(partition)
            offset, check = (None, 0) if last is None else (last[0], record_check(last[1], last[2]))
            store.write(rows, offset, check)
        self._staged.clear()
        self._last.clear()

    # -- retention
    def expired(self) -> list[tuple[int, str]]:
        if not self.retention_ms:
            return []
        cutoff = self.clock() - self.retention_ms
        gone = []
        for partition, store in self.partitions.items():
            due = store.oldest(before_ms=cutoff)
            if not due:
                continue
            staged = self._staged.setdefault(partition, {})
            for _, key in due:
                row = staged.get(key, False)
                if row is None or (row is not False and row[1] > cutoff):
                    continue  # forgotten already, or written again in this checkpoint
                staged[key] = None
                gone.append((partition, orjson.loads(key)))
        return gone

    def expiry_due(self) -> bool:
        if not self.retention_ms:
            return False
        cutoff = self.clock() - self.retention_ms
        return any(store.oldest(limit=1, before_ms=cutoff) for store in self.partitions.values())

    # -- what it holds
    def keys(self) -> int:
        return sum(s.meta["keys"] for s in self.partitions.values())

    @property
    def size_bytes(self) -> int:
        return sum(s.meta["bytes"] for s in self.partitions.values())

    def decoded(self) -> dict[int, dict[str, dict]]:
        """Every partition's committed states as dicts (tests, debugging)."""
        return {p: {orjson.loads(k): orjson.loads(v) for k, v, _ in s.items()} for p, s in self.partitions.items()}

    # -- restore (streams/state/tables.py: restore)
    def restore_begin(self, partition: int) -> tuple[int, int] | None:
        """Open the partition's store; returns where its changelog is to be checked and read from: (offset of
        the last record the store holds, that record's check), or None: from the start."""
        store = self.partitions.get(partition) or self._opening.get(partition) or \
            PartitionStore(self.root / str(partition), self.resources)
        self._opening[partition] = store
        self._restoring[partition] = {}
        self._restored_to.pop(partition, None)
        return None if store.offset is None else (store.offset, store.meta["check"])

    def restore_reset(self, partition: int) -> None:
        """The store is not a prefix of the changelog: empty it (the restore reads the changelog from the start)."""
        self._opening[partition].wipe()
        self._restoring[partition] = {}
        self._restored_to.pop(partition, None)

    def restore_apply(self, partition: int, key: bytes, value: bytes | None, at_ms: int, offset: int) -> None:
        rows = self._restoring[partition]
        rows.pop(key, None)
        rows[key] = None if value is None else (value, at_ms)
        self._restored_to[partition] = (offset, record_check(key, value))
        if len(rows) >= RESTORE_CHUNK:
            self.restore_flush(partition)

    def restore_flush(self, partition: int) -> None:
        """Write what was read and not written yet (the partition is read to its end, or a chunk is full)."""
        rows = self._restoring[partition]
        if rows:
            offset, check = self._restored_to[partition]
            self._opening[partition].write(rows, offset, check)
            self._restoring[partition] = {}

    def restore_end(self, partition: int) -> None:
        """Install the restored store (on the thread that uses the table; `tables.restore` flushed it already, on
        the restoring thread)."""
        self._restoring.pop(partition, None)
        self.partitions[partition] = self._opening.pop(partition)

    def restore_abandon(self, partition: int) -> None:
        """A restore called off: its store is closed, not installed (what it wrote is a prefix of the changelog,
        checked like any store at the next restore)."""
        self._restoring.pop(partition, None)
        self._restored_to.pop(partition, None)
        store = self._opening.pop(partition, None)
        if store is not None and self.partitions.get(partition) is not store:
            store.close()


def make_tables(app_id: str, root: Path, cache_bytes: int, retention_ms: dict[str, int] | None = None,
                ) -> dict[str, RocksTable]:
    """Every feature table in RocksDB under `root/<table>/<partition>`, sharing one cache of `cache_bytes`."""
    retention_ms = retention_ms or {}
    resources = Resources(cache_bytes)
    return {name: RocksTable(name, changelog_topic(app_id, name), root / name, resources, retention_ms.get(name, 0))
            for name in TABLES}
