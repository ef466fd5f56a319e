"""Purging the internal topics behind the group's commits.

The stage topics (`features.<stage>`) and `posts.awaiting-text` are this application's own: only its worker
group reads them, and once a checkpoint has committed an offset on one of their partitions, the records
before it are never read again (a restart or a new owner resumes from the committed offset; the tables are
restored from their changelogs, not from these). So they are deleted (DeleteRecords up to the committed
offset), as Kafka Streams purges its repartition topics (`repartition.purge.interval.ms`, 30 s). Without it
they keep every bundle for the topic's retention: on Apache Kafka that is disk, and the embedded broker
rewrites everything it holds to one file about once a second while written to, so its CPU grows with what it
holds (docs/benchmarks.md, "What the embedded broker holds, and the passes' order").

Only offsets a transaction has committed are purged, so nothing still to be read is ever deleted: a zombie
worker's commits fail (it is fenced), so its offsets never come here. The platform's topics (posts, reports,
engagements, labels, bans, decisions, dead letters) and the changelogs are never touched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from modpipe.streams import metrics
from modpipe.streams.kafka.records import TP

from modpipe import log

_log = log.get(__name__)


class PurgePlan:
    """Which offsets to delete up to, and when: pure bookkeeping, no Kafka. `committed` takes each
    checkpoint's offsets; `take` returns, at most once per `interval_s`, the partitions whose committed
    offset moved past what was purged before (and marks them purged)."""

    def __init__(self, topics: Iterable[str], interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.topics = frozenset(topics)
        self.interval_s = interval_s
        self.clock = clock
        self._committed: dict[TP, int] = {}
        self._purged: dict[TP, int] = {}
        self._last = clock()

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0 and bool(self.topics)

    def committed(self, offsets: dict[TP, int]) -> None:
        for tp, offset in offsets.items():
            if tp[0] in self.topics and offset > self._committed.get(tp, -1):
                self._committed[TP(*tp)] = offset

    def take(self) -> dict[TP, int]:
        if not self.enabled or self.clock() - self._last < self.interval_s:
            return {}
        due = {tp: off for tp, off in self._committed.items() if off > self._purged.get(tp, 0)}
        if due:
            self._last = self.clock()
            self._purged.update(due)
        return due

    def failed(self, offsets: dict[TP, int]) -> None:
        """A purge that did not happen: try those partitions again at the next interval."""
        for tp, off in offsets.items():
            if self._purged.get(tp) == off:
                del self._purged[tp]


class Purger:
    """Runs a `PurgePlan` against the broker: `committed(offsets)` after each checkpoint's commit; a purge
    that is due runs on a thread of its own, never on the event loop or in the checkpoint's path, and one at
    a time. A failed purge (a broker that refuses DeleteRecords, an ACL that lacks DELETE) is logged and
    counted; the pipeline goes on and tries again at the next interval."""

    def __init__(self, plan: PurgePlan, admin_conf: dict, timeout_s: float = 30.0):
        self.plan = plan
        self.admin_conf = admin_conf
        self.timeout_s = timeout_s
        self._admin = None
        self._busy = threading.Lock()
        self._warned = False
        if plan.enabled:  # every series exported at 0 from the start (streams/metrics.py, init_labels)
            for topic in plan.topics:
                for outcome in ("ok", "error"):
                    metrics.INTERNAL_PURGES.labels(topic, outcome)

    def committed(self, offsets: dict[TP, int]) -> None:
        if not self.plan.enabled:
            return
        self.plan.committed(offsets)
        if self._busy.locked():
            return
        due = self.plan.take()
        if due:
            self._busy.acquire()
            threading.Thread(target=self._purge, args=(due,), name="purge", daemon=True).start()

    def _purge(self, due: dict[TP, int]) -> None:
        try:
            try:
                failed = self.delete(due)
            except Exception as exc:  # noqa: BLE001 - a purge is housekeeping: it never stops the worker
                failed = {tp: str(exc)[:300] for tp in due}
            for tp in due:
                metrics.INTERNAL_PURGES.labels(tp[0], "error" if tp in failed else "ok").inc()
            if failed:
                self.plan.failed({tp: due[tp] for tp in failed})
                if not self._warned:  # once: a broker that refuses keeps refusing
                    _log.warning("purging internal topic records failed; they stay until their retention",
                                 extra={"partitions": len(failed), "error": next(iter(failed.values()))})
                    self._warned = True
        finally:
            self._busy.release()  # last: the plan is the event loop's again

    def delete(self, due: dict[TP, int]) -> dict[TP, str]:
        """DeleteRecords up to each offset; returns the partitions that failed, with why."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(self.admin_conf)
        futures = self._admin.delete_records([TopicPartition(t, p, off) for (t, p), off in due.items()],
                                             request_timeout=self.timeout_s)
        failed = {}
        for tp, future in futures.items():
            try:
                future.result(self.timeout_s)
            except Exception as exc:  # noqa: BLE001 - reported per partition
                failed[TP(tp.topic, tp.partition)] = str(exc)[:300]
        return failed
