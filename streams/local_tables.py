"""A worker's local table stores that are ahead of their changelog are discarded, and rebuilt from it.

Each RocksDB partition store remembers the last changelog offset it applied. When the broker has fewer
records than that (it lost acknowledged writes: noida-db saves its data about once a second, so a SIGKILL
loses up to a second; on Apache Kafka an unclean leader election or a re-created topic does the same), faust
refuses to start (ConsistencyError) and a restarted worker crashed again and again. Kafka Streams, in the
same situation, wipes the task's store and restores it from the changelog; so do we:

- before faust starts, every local partition store whose offset is beyond its changelog's end is removed
  (`discard_ahead`), so recovery reads that partition's changelog from the beginning;
- a ConsistencyError raised anyway (a partition this worker did not have locally at start, assigned later)
  removes the store it names (`discard_named`); the worker exits and its supervisor restarts it.

The changelog is the tables' source of truth: what it lost, the inputs replay (their committed offsets went
back with it on a broker that restores a snapshot), and the states ignore what they already counted.

A store can also be ahead of its changelog after the worker itself dies: a state is written into the store
when its changelog record is produced, before the broker has it, and a SIGKILL loses the record but not
the store's write. The input that changed it is processed again after the restart, finds the change
already in the state (the states ignore what they have counted) and writes nothing: the changelog, and any
worker restoring from it, never gets it (`modpipe chaos` found a user's post counted on one machine and
missing from the changelog). So a worker marks a clean stop (everything it wrote delivered) in its table
directory, and at start, without that mark, removes every local store (`discard_after_unclean_stop`):
they are restored from the changelogs, as Kafka Streams restores a task's store after an unclean shutdown
under exactly-once. A crash costs a full restore of this worker's partitions instead of a catch-up.
"""

from __future__ import annotations

import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from modpipe import log
from modpipe.settings import Settings

_log = log.get(__name__)

CLEAN_STOP_MARK = ".modpipe-clean-stop"  # written last by a worker whose every write was delivered
OFFSET_KEY = b"__faust\0offset__"  # faust.stores.rocksdb.Store.offset_key
_STORE = re.compile(r"^(?P<table>.+)-(?P<partition>\d+)\.db$")
_TP = re.compile(r"TP\(topic='(?P<topic>[^']+)', partition=(?P<partition>\d+)\)")


def persisted_offset(path: Path) -> int | None:
    """The last changelog offset a faust RocksDB partition store applied (None: unknown / unreadable)."""
    from rocksdict import AccessType, Options, Rdict

    try:
        db = Rdict(str(path), options=Options(raw_mode=True), access_type=AccessType.read_only())
    except Exception:  # noqa: BLE001 - a store we cannot read is left for faust to judge
        return None
    try:
        value = db.get(OFFSET_KEY)
        return int(value) if value is not None else None
    finally:
        db.close()


def stores(tabledir: Path) -> dict[tuple[str, int], Path]:
    """(table name, partition) -> store directory of every local partition store."""
    out = {}
    for path in sorted(tabledir.glob("*.db")) if tabledir.is_dir() else []:
        m = _STORE.match(path.name)
        if m:
            out[(m["table"], int(m["partition"]))] = path
    return out


def discard_after_unclean_stop(tabledir: Path) -> list[str]:
    """At start: remove every local store unless the last worker on `tabledir` stopped cleanly. The mark is
    removed either way: this run is unclean until it stops cleanly. Returns what was removed."""
    mark = tabledir / CLEAN_STOP_MARK
    clean = mark.exists()
    mark.unlink(missing_ok=True)
    if clean:
        return []
    removed = []
    for path in stores(tabledir).values():
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    if removed:
        _log.warning("the last worker on this state directory did not stop cleanly: local table stores "
                     "discarded, restored from the changelogs", extra={"stores": len(removed)})
    return removed


def mark_clean_stop(tabledir: Path) -> None:
    """Everything this worker wrote is delivered: its stores may be kept for the next start."""
    tabledir.mkdir(parents=True, exist_ok=True)
    (tabledir / CLEAN_STOP_MARK).write_text("stopped cleanly: every changelog record delivered\n")


def discard_ahead(tabledir: Path, app_id: str, end_offset: Callable[[str, int], int | None]) -> list[str]:
    """Remove the stores whose persisted offset is at or beyond their changelog's end (`end_offset(topic,
    partition)`: the high watermark, the offset the next record will get). Returns what was removed."""
    removed = []
    for (table, partition), path in stores(tabledir).items():
        offset = persisted_offset(path)
        if offset is None:
            continue
        end = end_offset(f"{app_id}-{table}-changelog", partition)
        if end is not None and offset >= end:
            _log.error("local table store is ahead of its changelog (the broker lost acknowledged writes): "
                       "discarded, it is rebuilt from the changelog",
                       extra={"table": table, "partition": partition, "persisted_offset": offset, "changelog_end": end})
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def discard_named(tabledir: Path, app_id: str, message: str) -> list[str]:
    """The store a faust ConsistencyError names (its changelog topic partition), removed."""
    removed = []
    for m in _TP.finditer(message):
        topic, partition = m["topic"], int(m["partition"])
        prefix, suffix = f"{app_id}-", "-changelog"
        if topic.startswith(prefix) and topic.endswith(suffix):
            path = tabledir / f"{topic[len(prefix):-len(suffix)]}-{partition}.db"
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
    if removed:
        _log.error("local table store was ahead of its changelog: discarded, rebuilt from the changelog at restart",
                   extra={"stores": removed})
    return removed


class ChangelogEnds:
    """`ends(topic, partition)`: a changelog partition's high watermark read from the broker (None where the
    topic does not exist yet)."""

    def __init__(self, settings: Settings, bootstrap: str):
        from confluent_kafka import Consumer

        self._consumer = Consumer({**settings.kafka_client_config(), "bootstrap.servers": bootstrap,
                                   "group.id": f"modpipe-tablecheck-{uuid.uuid4().hex[:8]}",
                                   "enable.auto.commit": False})
        self._known = set(self._consumer.list_topics(timeout=30).topics)

    def __call__(self, topic: str, partition: int) -> int | None:
        from confluent_kafka import TopicPartition

        if topic not in self._known:
            return None
        return self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)[1]

    def close(self) -> None:
        self._consumer.close()
