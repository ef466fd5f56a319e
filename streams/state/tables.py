"""Feature tables: each table partition's states in the worker's memory, backed by a changelog topic.

A table partition lives on the worker that owns the stage-topic partition of the same number (the stage
topics are partitioned by the key their tables count). When partitions are assigned, the worker restores each
of their table partitions by reading its changelog `read_committed` up to the end committed with that stage
partition's offset (streams/state/ends.py): exactly the states that were committed together with the input
offsets the worker starts from (one Kafka transaction per checkpoint, streams/checkpointing/checkpoint.py). So a
restored table is never behind nor ahead of the committed input, and the input processed again after a crash is
counted once, from the state as it was when that input's offsets were committed.

States are written once per changed key per checkpoint (`streams/state/table_states.py`): into this store and, as a
changelog record in the open transaction, to the changelog partition of the same number. The records are
what faust wrote (the key and the state as JSON, changelog `<app id>-features-<table>-changelog`), so
`modpipe chaos` and `modpipe.features.offline` read them the same way.

Memory. A state is held as the very bytes of its changelog record, not as the decoded dict: a post's state (its
decision snapshot included) is ~2 KB of JSON, and 120,000 of them took ~1.6 KB of memory each as bytes against
~4.7 KB each as dicts (docs/benchmarks.md, Soak). The decoded states a stage is working with live in
`table_states.TableStates`' bounded cache.

Retention. A table with a retention forgets a key that was not written for that long (wall-clock time of the
write; a restored key keeps the timestamp of its changelog record, so a restart does not make it young again).
Each partition keeps its keys in the order they were last written, so `expired` pops them from the front without
a scan; the caller writes a tombstone for each into the open transaction, so a restore forgets them too. Without
it the post table grows by one state per post for ever (a soak run at 25 posts/s grew a worker by ~14 MiB a
minute). Forgetting is what a late event sees: a report on a post forgotten already finds no snapshot to
decide the post again from, and counts start from zero for a user or URL not seen for the retention.
"""

from __future__ import annotations

import collections
import time
import zlib
from collections.abc import Callable

import orjson
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from modpipe.features.events import TABLES
from modpipe.streams import metrics

from modpipe import log, schema
from modpipe.services.offsets import watermarks
from modpipe.settings import Settings

_log = log.get(__name__)
class RestoreCancelled(Exception):
    """The restore was called off (its partitions were revoked while it read): nothing of it was installed."""


RESTORE_PROGRESS_S = 15.0  # a restore still reading after this long says where it stands, and again after each


def changelog_topic(app_id: str, table: str) -> str:
    return f"{app_id}-features-{table}-changelog"


def encode_key(key: str) -> bytes:
    return schema.dumps_kept(key)  # held: a staged write's key, a changelog record's until it is delivered


def encode_value(value: dict) -> bytes:
    return schema.dumps_kept(value)  # held the same way, and by an in-memory table for good


def _wall_ms() -> int:
    return int(time.time() * 1000)


class Table:
    """One table's partitions held by this worker in memory: {partition: {key: (encoded state, written at
    ms)}}, each partition's keys in the order they were last written (the oldest first).
    (`streams/state/rocksdb.py`: the same on disk.)"""

    backend = "memory"
    delivered = None  # no changelog positions to keep: a restore reads the whole changelog

    def __init__(self, name: str, changelog: str, retention_ms: int = 0, clock=_wall_ms):
        self.name, self.changelog = name, changelog
        self.retention_ms = retention_ms  # 0: keys are kept for ever
        self.clock = clock
        self.partitions: dict[int, collections.OrderedDict[str, tuple[bytes, int]]] = {}
        self.size_bytes = 0  # encoded states held, all partitions
        self._restoring: dict[int, collections.OrderedDict[str, tuple[bytes, int]]] = {}

    def get(self, key: str, partition: int) -> dict | None:
        row = self.partitions.get(partition, {}).get(key)
        return None if row is None else orjson.loads(row[0])

    def set(self, key: str, value: dict, partition: int) -> bytes:
        """Store the state; returns its encoding (the changelog record's value)."""
        data = encode_value(value)
        self.put(key, data, partition, self.clock())
        return data

    def put(self, key: str, data: bytes, partition: int, written_at_ms: int) -> None:
        rows = self.partitions.get(partition)
        if rows is None:
            rows = self.partitions[partition] = collections.OrderedDict()
        old = rows.pop(key, None)  # re-inserted at the end: the newest write
        if old is not None:
            self.size_bytes -= len(old[0])
        rows[key] = (data, written_at_ms)
        self.size_bytes += len(data)

    def delete(self, key: str, partition: int) -> None:
        old = self.partitions.get(partition, {}).pop(key, None)
        if old is not None:
            self.size_bytes -= len(old[0])

    def expired(self) -> list[tuple[int, str]]:
        """Remove the keys not written for the retention; returns them as (partition, key)."""
        if not self.retention_ms:
            return []
        cutoff = self.clock() - self.retention_ms
        gone = []
        for partition, rows in self.partitions.items():
            while rows:
                key, (data, written_at) = next(iter(rows.items()))
                if written_at > cutoff:
                    break
                del rows[key]
                self.size_bytes -= len(data)
                gone.append((partition, key))
        return gone

    def expiry_due(self) -> bool:
        """Whether `expired` would forget a key now (the oldest key of each partition is all it looks at)."""
        if not self.retention_ms:
            return False
        cutoff = self.clock() - self.retention_ms
        return any(rows and next(iter(rows.values()))[1] <= cutoff for rows in self.partitions.values())

    def drop(self, partition: int) -> None:
        rows = self.partitions.pop(partition, None)
        if rows:
            self.size_bytes -= sum(len(data) for data, _ in rows.values())

    def replace(self, partition: int, rows: collections.OrderedDict[str, tuple[bytes, int]]) -> None:
        self.drop(partition)
        self.partitions[partition] = rows
        self.size_bytes += sum(len(data) for data, _ in rows.values())

    def keys(self) -> int:
        return sum(len(p) for p in self.partitions.values())

    def committed(self) -> None:
        """The checkpoint's transaction committed (nothing to do: memory does not outlive the process)."""

    def close(self) -> None:
        pass

    # -- restore: the whole changelog into a fresh partition, which replaces the old one at the end. Every step but
    # `restore_end` touches only the partition being restored, so a restore may read on another thread while the
    # loop works on the installed partitions; `restore_end` installs it (on the thread that uses the table).
    def restore_begin(self, partition: int) -> None:
        self._restoring[partition] = collections.OrderedDict()
        return None  # from the changelog's start

    def restore_apply(self, partition: int, key: bytes, value: bytes | None, at_ms: int, offset: int) -> None:
        rows = self._restoring[partition]
        k = orjson.loads(key)
        rows.pop(k, None)  # a key written again goes to the end: rows stay in the order of writes
        if value is not None:
            rows[k] = (value, at_ms)

    def restore_flush(self, partition: int) -> None:
        """The partition read to its end (nothing to write ahead: memory is installed whole)."""

    def restore_end(self, partition: int) -> None:
        self.replace(partition, self._restoring.pop(partition))

    def restore_abandon(self, partition: int) -> None:
        """A restore called off: what it read is dropped, nothing installed."""
        self._restoring.pop(partition, None)

    def decoded(self) -> dict[int, dict[str, dict]]:
        """Every partition's states as dicts (tests, debugging)."""
        return {p: {k: orjson.loads(data) for k, (data, _) in rows.items()} for p, rows in self.partitions.items()}


def _positions(consumer: Consumer, tps: list[tuple[str, int]], ends: dict[tuple[str, int], int]) -> list[dict]:
    """Where the restore stands in each of `tps`: its position, the end it reads to, and the partition's log
    start and end as the consumer last heard them."""
    out = []
    for tp in consumer.position([TopicPartition(t, p) for t, p in tps]):
        low, high = consumer.get_watermark_offsets(tp, cached=True)
        out.append({"topic": tp.topic, "partition": tp.partition, "position": tp.offset,
                    "end": ends.get((tp.topic, tp.partition)), "low": low, "high": high})
    return out


def make_tables(app_id: str, retention_ms: dict[str, int] | None = None) -> dict[str, Table]:
    """Every feature table; `retention_ms`: table name -> its retention (absent or 0: kept for ever)."""
    retention_ms = retention_ms or {}
    return {name: Table(name, changelog_topic(app_id, name), retention_ms.get(name, 0)) for name in TABLES}


END_ASK_S = 0.5  # how long a restore waits for a partition's high watermark before it reads and asks again


def record_check(key: bytes, value: bytes | None) -> int:
    """What identifies a changelog record beside its offset (a tombstone differs from an empty value)."""
    return zlib.crc32(value if value is not None else b"\x00tombstone", zlib.crc32(key))


def restore(tables: list, partitions: list[int], settings: Settings, bootstrap: str,
            timeout_s: float = 600.0, ends: dict[tuple[str, int], int] | None = None,
            reached: dict[tuple[str, int], int] | None = None, install: bool = True,
            cancelled: Callable[[], bool] | None = None) -> int:
    """Bring the given partitions of `tables` level with what their changelogs hold (committed records only):
    an in-memory table reads its changelog from the start; a RocksDB table (streams/state/rocksdb.py) only what
    its store does not hold yet, once the record at the store's offset proved to be the one the store
    remembers (else the store is wiped and read from the start). Blocking; returns the records applied.

    `ends`: (changelog, partition) -> the end committed with the input offsets the worker starts from
    (streams/state/ends.py). Such a partition is read to exactly that end: records at or past it are not
    applied (no commit of offsets has taken them in yet), and a committed record below it that the broker does
    not hand out yet (a transaction still open below it, or its own markers not written yet) is waited for. A
    partition without one (its offsets were committed without ends, or never) is read to the end a read_committed
    client is told when the restore starts: its last stable offset. `reached` gets the end each was read to.

    `install=False`: the partitions are read (and a RocksDB store written) but not installed: the caller calls
    each table's `restore_end(partition)` on the thread that uses the tables (the runner restores off its event
    loop while other partitions are worked on). `cancelled()` true stops the read with RestoreCancelled, nothing
    installed."""
    if not tables or not partitions:
        return 0
    try:
        return _restore(tables, partitions, settings, bootstrap, timeout_s, ends, reached, install, cancelled)
    except BaseException:  # failed or called off: nothing half read stays behind
        for t in tables:
            for p in partitions:
                t.restore_abandon(p)
        raise


def _restore(tables, partitions, settings, bootstrap, timeout_s, ends, reached, install, cancelled) -> int:
    started = time.monotonic()
    deadline = started + timeout_s
    by_topic = {t.changelog: t for t in tables}
    # Each changelog partition is read from the start, or, behind a store, from the offset of the store's last
    # record: that record must come first (then the tail follows), else the store is not a prefix of the
    # committed changelog. (Reading from the record itself, not the offset after it: librdkafka does not move
    # its position past a transaction marker that it fetched without a record before it, so a read that
    # started at the marker after the store's last record would not see itself at the end.)
    starts: dict[tuple[str, int], int] = {}
    checking: dict[tuple[str, int], tuple[int, int]] = {}  # (offset, check) of the store's last record
    for t in tables:
        for p in partitions:
            at = t.restore_begin(p)
            starts[(t.changelog, p)] = OFFSET_BEGINNING if at is None else at[0]
            if at is not None:
                checking[(t.changelog, p)] = at
    from_store = len(checking)
    fixed = {tp: end for tp, end in (ends or {}).items() if tp in starts}
    # fetch.wait.max.ms: a broker answers one request per connection at a time, so a fetch of a partition read
    # to its end, waiting the default 500 ms for news, held each end-offset query behind it past END_ASK_S (a
    # restore of 20 tails took 20-30 s instead of 0.2)
    conf = {**settings.kafka_client_config(), "bootstrap.servers": bootstrap, "group.id": f"{settings.app_id}-restore",
            "enable.auto.commit": False, "isolation.level": "read_committed", "enable.partition.eof": True,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10}
    records = 0
    wrong: set[tuple[str, int]] = set()  # stores that are not a prefix of their changelog

    def apply(m) -> bool:
        nonlocal records
        tp = (m.topic(), m.partition())
        expected = checking.pop(tp, None)
        if expected is not None:
            if (m.offset(), record_check(m.key(), m.value())) == expected:
                return False  # the store's own last record: the tail follows
            wrong.add(tp)
            return True  # no more of it: it is read again from the start
        kind, at_ms = m.timestamp()
        table = by_topic[m.topic()]
        if kind == TIMESTAMP_NOT_AVAILABLE:
            at_ms = table.clock()
        table.restore_apply(m.partition(), m.key(), m.value(), at_ms, m.offset())
        records += 1
        return False
    read_to = _read(conf, starts, apply, deadline, fixed, cancelled)
    # read to the end without finding the store's last record (aborted, at or beyond the committed end)
    wrong |= set(checking)
    if wrong:
        for tp in sorted(wrong):
            _log.warning("table store does not match its changelog; restoring it from the start", extra={
                "table": by_topic[tp[0]].name, "partition": tp[1], "store_offset": starts[tp],
                "committed_end": fixed.get(tp)})
            by_topic[tp[0]].restore_reset(tp[1])
        checking.clear()
        read_to.update(_read(conf, {tp: OFFSET_BEGINNING for tp in wrong}, apply, deadline, fixed, cancelled))
    for topic, p in starts:
        by_topic[topic].restore_flush(p)
        if install:
            by_topic[topic].restore_end(p)
    if reached is not None:
        reached.update(read_to)
    metrics.RESTORED_RECORDS.inc(records)
    metrics.RESTORE_SECONDS.set(time.monotonic() - started)
    _log.info("tables restored", extra={"tables": sorted(by_topic), "partitions": sorted(partitions),
                                        "records": records, "from_store": from_store - len(wrong),
                                        "reset": len(wrong), "to_committed_ends": len(fixed),
                                        "seconds": round(time.monotonic() - started, 2)})
    return records


def _read(conf: dict, starts: dict[tuple[str, int], int], on_message, deadline: float,
          fixed: dict[tuple[str, int], int] | None = None,
          cancelled: Callable[[], bool] | None = None) -> dict[tuple[str, int], int]:
    """Read each changelog partition from its start to its end, committed records only; `on_message(m)`
    returns True when it wants no more of the record's partition. `fixed`: the partitions' committed ends (see
    `restore`); the others are read to the end asked when the read starts. Returns the end each was read to."""
    fixed = fixed or {}
    consumer = Consumer(conf)
    try:
        # Without a committed end: read to the end asked at the restore's start, not to the first
        # end-of-partition event. Asked by this read_committed client, that end is the last stable offset
        # (ListOffsets takes the client's isolation level): a checkpoint whose producer has committed while its
        # markers are not in the changelog yet is missed, and so is everything above a transaction still open;
        # the high watermark would wait for every open transaction, a frozen zombie's above the committed
        # records included (docs/faults.md). Positions pass a marker or an aborted transaction's records.
        ends: dict[tuple[str, int], int] = dict(fixed)  # the others asked inside the loop (a broker may not answer)
        consumer.assign([TopicPartition(topic, p, offset) for (topic, p), offset in starts.items()])
        left = set(starts)
        seen: dict[tuple[str, int], int] = {}  # the offset after the last record read, per partition
        enough: set[tuple[str, int]] = set()  # partitions `on_message` wants no more of
        started = time.monotonic()
        report_at = started + RESTORE_PROGRESS_S

        def done(tp: tuple[str, int]) -> None:
            left.discard(tp)
            if tp not in enough:
                enough.add(tp)
                consumer.pause([TopicPartition(*tp)])

        for tp in [tp for tp in left if tp in ends]:
            if ends[tp] <= 0 or 0 <= starts[tp] >= ends[tp]:
                left.discard(tp)
        while left:
            if cancelled is not None and cancelled():
                raise RestoreCancelled(f"restore called off with {len(left)} changelog partitions left")
            if time.monotonic() > deadline:
                raise TimeoutError(f"changelogs not read to their end in time: {sorted(left)[:4]}")
            if time.monotonic() >= report_at:  # a restore that does not end must be visible, not silent
                report_at += RESTORE_PROGRESS_S
                waiting = sorted(tp for tp in left if tp in fixed)
                behind = _positions(consumer, sorted(left)[:4], ends)
                _log.warning("changelog restore still reading" + (
                    ": committed records below a checkpoint's end are not handed out yet (a transaction still "
                    "open below them, a killed or frozen worker's, holds them until its restart or "
                    "transaction.timeout.ms aborts it; or their markers are not written yet)" if waiting else ""),
                    extra={"seconds": round(time.monotonic() - started), "partitions_left": len(left),
                           "behind": behind})
                gone = [b for b in behind if b["end"] is not None and 0 <= b["high"] < b["end"] and
                        (b["topic"], b["partition"]) in fixed]
                if gone:  # waiting cannot help: the restore fails at its timeout, and the worker with it
                    _log.error("changelog ends below the end committed with its offsets: committed states are gone "
                               "(the topic deleted or truncated, or an unclean leader election)", extra={"behind": gone})
            for topic, p in [tp for tp in left if tp not in ends]:
                try:
                    ends[(topic, p)] = watermarks(consumer, TopicPartition(topic, p), END_ASK_S,
                                                  topic_may_be_new=False)[1]
                except KafkaException as exc:
                    if exc.args[0].fatal() or exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise
                    continue  # asked again on the next pass
                if ends[(topic, p)] <= 0 or 0 <= starts[(topic, p)] >= ends[(topic, p)]:
                    left.discard((topic, p))
            batch = consumer.consume(1000, 0.05)
            known = [TopicPartition(t, p) for t, p in left if (t, p) in ends]
            if known and (not batch or any(m.error() is not None for m in batch)):
                for tp in consumer.position(known):
                    if tp.offset >= ends[(tp.topic, tp.partition)]:
                        left.discard((tp.topic, tp.partition))
            for m in batch:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        tp = (m.topic(), m.partition())
                        if tp in fixed and m.offset() >= fixed[tp]:  # everything below the end is read
                            done(tp)
                        continue
                    if err.fatal() or err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise KafkaException(err)
                    _log.warning("changelog read error", extra={"error": str(err)})
                    continue
                tp = (m.topic(), m.partition())
                if tp in enough:
                    continue
                if tp in fixed and m.offset() >= fixed[tp]:  # committed after the offsets the worker starts from
                    done(tp)
                    continue
                seen[tp] = m.offset() + 1
                if on_message(m):
                    done(tp)
                elif tp in fixed and m.offset() + 1 >= fixed[tp]:
                    done(tp)
        return {tp: max(ends.get(tp, 0), seen.get(tp, 0)) for tp in starts}
    finally:
        consumer.close()
