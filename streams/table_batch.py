"""One batch of a table stage: each key's state is loaded once, updated by the batch's events in order,
and written once.

A hot key (a campaign's domain or link, a bot's account) then costs one state decode, one encode and
one changelog record per batch instead of one per event: the states hold the ids they counted (for
exactness under redelivery), so they are kilobytes, and rewriting one per event dominated the stage.

faust takes a table access's partition (the changelog partition of a write; with RocksDB, the
partition database of a read) from the *current event*, a context variable it sets while a stream is
iterated one event at a time. A batch handles many events, so `use_event` points it at the event in
hand; a key's single write goes out under the last event that changed it. Every event of a key comes
from the same partition, because each stage topic is keyed like its table.
"""

from __future__ import annotations

import weakref
from typing import Any

# faust-streaming 0.15 (pinned): the context variable behind faust.streams.current_event(). faust has no
# public setter; tables read it in Collection.partition_for_key / _send_changelog and the RocksDB store.
from faust.streams import _current_event

from features.state import Limits, load_state


def use_event(event) -> None:
    """Make `event` faust's current event: table reads and writes below go to its partition."""
    _current_event.set(weakref.ref(event))


class TableBatch:
    """States of one table's keys while a batch of events is applied to them."""

    def __init__(self, table_name: str, table: Any, limits: Limits):
        self.table_name, self.table, self.limits = table_name, table, limits
        self._states: dict[str, Any] = {}
        self._ops: dict[str, list[tuple]] = {}  # key -> state operations done in this batch, in order
        self._dirty: dict[str, Any] = {}  # key -> last event that changed its state

    def state(self, key: str, event):
        """The key's state: from the table on first use in this batch, then the same object."""
        use_event(event)
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = load_state(self.table_name, self.table.get(key), self.limits)
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
        self._states[key] = state

    def flush(self) -> int:
        """Write every changed state once; returns the number of writes."""
        for key, event in self._dirty.items():
            use_event(event)
            self.table[key] = self._states[key].to_dict()
        written = len(self._dirty)
        self._states.clear()
        self._ops.clear()
        self._dirty.clear()
        return written
