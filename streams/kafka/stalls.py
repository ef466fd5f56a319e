"""Which assigned partitions have records to give and have given nothing for a while (pure; no Kafka).

On Apache Kafka, after broker nodes were killed and the group rebalanced several times, a worker has been
seen holding partitions whose records it never fetched again: assigned, not paused by us, the group stable, no
transaction open, the consumer polling, and nothing of those partitions coming (docs/faults.md). librdkafka
does not report it. The consumer's poll thread feeds this watch with what each partition delivered (records
and end-of-partition events) and, for the partitions quiet for `stall_s`, the last stable offset the broker
reports; a partition whose end lies past what it delivered, quiet that long, is stalled: the consumer logs
librdkafka's view of it, seeks it to where it stopped (a seek restarts its fetcher), and fails once the same
partition stalls again after that, so that the worker restarts with a new consumer.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable


class FetchWatch:
    """Per assigned partition: how far the consumer got (`reached`: the offset after its last record, or where an
    end-of-partition event found it) and when it last moved."""

    def __init__(self, stall_s: float):
        self.stall_s = stall_s
        self.reached: dict[Hashable, int] = {}
        self._moved_at: dict[Hashable, float] = {}
        self.kicked: set[Hashable] = set()  # stalled once already in this assignment

    def assigned(self, tps: Iterable[Hashable], committed: dict, now: float) -> None:
        """A new assignment: each partition starts at its committed offset (when known) and counts as moving."""
        self.revoked()
        self.added(tps, committed, now)

    def added(self, tps: Iterable[Hashable], committed: dict, now: float) -> None:
        """Partitions held back at the assignment were released: watched from now, like the others."""
        for tp in tps:
            if committed.get(tp, -1) >= 0:
                self.reached[tp] = committed[tp]
            self._moved_at[tp] = now

    def revoked(self) -> None:
        self.reached, self._moved_at, self.kicked = {}, {}, set()

    def moved(self, tp: Hashable, reached: int, now: float) -> None:
        """A record (reached = its offset + 1) or an end-of-partition event (reached = its offset) of `tp`."""
        if tp in self._moved_at:
            self.reached[tp] = max(self.reached.get(tp, reached), reached)
            self._moved_at[tp] = now

    def start(self, tp: Hashable, offset: int) -> None:
        """Where `tp` begins when it has delivered nothing yet: its committed offset looked up later, or its log
        start when it has none."""
        if tp in self._moved_at:
            self.reached.setdefault(tp, offset)

    def sought(self, tp: Hashable, offset: int, now: float) -> None:
        """The consumer was sent back to `offset` of `tp` (a read-again, or this watch's own kick)."""
        if tp in self._moved_at:
            self.reached[tp] = offset
            self._moved_at[tp] = now

    def hold(self, now: float) -> None:
        """The consumer holds every partition back itself (back-pressure, a fresh assignment): none is quiet."""
        for tp in self._moved_at:
            self._moved_at[tp] = now

    def quiet(self, now: float) -> list:
        """Partitions that have not moved for `stall_s`: the ones whose end is worth asking for."""
        return [tp for tp, at in self._moved_at.items() if now - at >= self.stall_s]

    def stalled(self, ends: dict, now: float) -> list:
        """Of the quiet partitions, those with records past what they delivered. `ends`: the last stable offset
        of each quiet partition (missing: not known now). A partition whose start is not known is never judged
        (a guess could send it back over records already committed). A quiet partition at its end is idle, not
        stalled: it counts as moving again (asked again `stall_s` later)."""
        out = []
        for tp in self.quiet(now):
            end, at = ends.get(tp), self.reached.get(tp)
            if end is None or at is None:
                continue
            if end <= at:
                self._moved_at[tp] = now
            else:
                out.append(tp)
        return out
