"""Where each table partition's committed changelog ends, carried with the input offsets it belongs to.

A checkpoint (streams/checkpointing/checkpoint.py) commits its changelog records and its input offsets in one
Kafka transaction. With the offsets of each stage-topic partition it sends, as the offset commit's metadata, the
end of every changelog partition of that stage's tables at the same partition number: the offset after the last
record committed so far (known from the delivery reports, which the checkpoint waits for before it commits). A
stage topic is partitioned like its tables, and with range assignment partition p of every input topic is one
worker's, so the worker that takes stage partition p over finds there, committed atomically with the offsets it
starts from, exactly where the states those offsets stand for end. The restore (`tables.restore`) reads each
changelog `read_committed` up to that end and no further: nothing committed is missed (a checkpoint whose
markers are not written yet is waited for), and nothing above it is waited for (a zombie's transaction opened
after the last commit).

The metadata is one short string per partition (`encode`: ~30 bytes per table, two tables at most per stage),
far below Kafka's `offset.metadata.max.bytes` (4096 by default; a longer one fails the commit with
OFFSET_METADATA_TOO_LARGE, measured on Apache Kafka 4.1.1). Each offset commit of a partition replaces its
metadata, so every commit of a stage partition carries the ends of all its stage's tables, changed or not, and a
checkpoint that wrote a table partition's changelog commits that stage partition's offset too (unchanged if none
of its records was processed), expiry's tombstones included: every transaction that writes states commits offsets,
which fences it by the group generation (KIP-447).
"""

from __future__ import annotations

import orjson

PREFIX = "modpipe.ends.v1:"  # a group's metadata written by anything else is not taken for ends
MAX_METADATA_BYTES = 4096  # Apache Kafka's offset.metadata.max.bytes default


def encode(ends: dict[str, int]) -> str:
    """The offset-commit metadata holding `ends` (table name -> the offset after its last committed record)."""
    text = PREFIX + orjson.dumps(dict(sorted(ends.items()))).decode()
    if len(text.encode()) > MAX_METADATA_BYTES:  # a commit would fail with OFFSET_METADATA_TOO_LARGE
        raise ValueError(f"changelog ends take {len(text.encode())} bytes, above {MAX_METADATA_BYTES}")
    return text


def decode(metadata: str | None) -> dict[str, int] | None:
    """The ends an offset commit's metadata holds; None when it holds none (committed before the ends were
    carried, or by something else)."""
    if not metadata or not metadata.startswith(PREFIX):
        return None
    try:
        ends = orjson.loads(metadata[len(PREFIX):])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(ends, dict) or not all(isinstance(k, str) and type(v) is int and v >= 0
                                             for k, v in ends.items()):
        return None
    return ends


class ChangelogEnds:
    """This worker's view of its table partitions' changelog ends: `committed` (restored at the assignment, moved
    by each checkpoint that commits) and those of the open checkpoint's records delivered so far."""

    def __init__(self):
        self.committed: dict[tuple[str, int], int] = {}  # (table, partition) -> end
        self._open: dict[tuple[str, int], int] = {}

    def restored(self, table: str, partition: int, end: int) -> None:
        self.committed[(table, partition)] = end
        self._open.pop((table, partition), None)

    def delivered(self, table: str, partition: int, offset: int) -> None:
        """A changelog record of the open checkpoint was delivered at `offset`."""
        key = (table, partition)
        if offset + 1 > self._open.get(key, -1):
            self._open[key] = offset + 1

    def written(self) -> set[tuple[str, int]]:
        """(table, partition) of every changelog partition the open checkpoint has written to."""
        return set(self._open)

    def of(self, tables, partition: int) -> dict[str, int]:
        """The ends of `tables` at `partition` as the open checkpoint leaves them (those known)."""
        out = {}
        for table in tables:
            end = max(self.committed.get((table, partition), -1), self._open.get((table, partition), -1))
            if end >= 0:
                out[table] = end
        return out

    def commit(self) -> None:
        """The open checkpoint committed: its ends are the committed ones."""
        for key, end in self._open.items():
            self.committed[key] = max(self.committed.get(key, 0), end)
        self._open.clear()

    def forget(self, partitions) -> None:
        """Revoked partitions: their ends are the next owner's to read."""
        gone = set(partitions)
        for d in (self.committed, self._open):
            for key in [k for k in d if k[1] in gone]:
                del d[key]
