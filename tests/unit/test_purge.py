"""streams/runtime/purge.py: which committed offsets are purged, and when (no broker: the deletion is a fake that
records what it was asked; tests/integration/test_purge.py runs it against the real one)."""

from __future__ import annotations

import threading

from modpipe.streams import metrics
from modpipe.streams.kafka.records import TP
from modpipe.streams.runtime.purge import PurgePlan, Purger


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def plan(interval_s: float = 30.0) -> tuple[PurgePlan, Clock]:
    clock = Clock()
    return PurgePlan(["features.user", "features.post"], interval_s, clock=clock), clock


def test_only_internal_topics_once_an_interval_has_passed():
    p, clock = plan()
    p.committed({TP("features.user", 0): 10, TP("posts", 0): 50, TP("features.post", 1): 3})
    assert p.take() == {}  # the interval has not passed since the plan started
    clock.now = 30.0
    assert p.take() == {TP("features.user", 0): 10, TP("features.post", 1): 3}  # never the platform's posts
    p.committed({TP("features.user", 0): 12})
    clock.now = 45.0
    assert p.take() == {}  # the next purge waits for the interval
    clock.now = 60.0
    assert p.take() == {TP("features.user", 0): 12}  # only what moved since


def test_offsets_never_move_back():
    p, clock = plan()
    p.committed({TP("features.user", 0): 10})
    p.committed({TP("features.user", 0): 7})  # an older checkpoint's offsets arriving late change nothing
    clock.now = 31.0
    assert p.take() == {TP("features.user", 0): 10}
    p.committed({TP("features.user", 0): 9})
    clock.now = 62.0
    assert p.take() == {}


def test_a_failed_purge_is_tried_again():
    p, clock = plan()
    p.committed({TP("features.user", 0): 10, TP("features.user", 1): 4})
    clock.now = 30.0
    due = p.take()
    p.failed({TP("features.user", 1): due[TP("features.user", 1)]})
    clock.now = 60.0
    assert p.take() == {TP("features.user", 1): 4}


def test_zero_interval_or_no_topics_disables_it():
    for p in (PurgePlan(["features.user"], 0), PurgePlan([], 30)):
        p.committed({TP("features.user", 0): 10})
        assert not p.enabled and p.take() == {}


class RecordingPurger(Purger):
    def __init__(self, plan, fail: bool = False):
        super().__init__(plan, {})
        self.asked: list[dict] = []
        self.fail = fail
        self.done = threading.Event()

    def delete(self, due):
        self.asked.append(dict(due))
        self.done.set()
        if self.fail:
            raise RuntimeError("DeleteRecords refused: TOPIC_AUTHORIZATION_FAILED")
        return {}


def test_the_purger_deletes_on_a_thread_and_counts_each_partition():
    p, clock = plan()
    purger = RecordingPurger(p)
    ok = metrics.INTERNAL_PURGES.labels("features.user", "ok")
    before = ok._value.get()
    clock.now = 30.0
    purger.committed({TP("features.user", 0): 10})
    assert purger.done.wait(5)
    purger._busy.acquire(timeout=5)  # the thread releases it last
    purger._busy.release()
    assert purger.asked == [{TP("features.user", 0): 10}]
    assert ok._value.get() == before + 1


def test_a_refused_purge_never_raises_and_is_retried():
    p, clock = plan()
    purger = RecordingPurger(p, fail=True)
    error = metrics.INTERNAL_PURGES.labels("features.post", "error")
    before = error._value.get()
    clock.now = 30.0
    purger.committed({TP("features.post", 2): 5})
    assert purger.done.wait(5)
    purger._busy.acquire(timeout=5)
    purger._busy.release()
    assert error._value.get() == before + 1
    purger.fail, purger.done = False, threading.Event()
    clock.now = 60.0
    purger.committed({})
    assert purger.done.wait(5)
    assert purger.asked[-1] == {TP("features.post", 2): 5}  # the refused partition, asked again
