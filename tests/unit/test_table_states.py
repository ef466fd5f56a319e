"""streams.table_states: a stage's state handling across batches, with a dict for the table and plain
objects for faust's events (TableStates needs only `get`, item assignment and weak-referenceable events)."""

from __future__ import annotations

import json
import random

from faust.streams import current_event

from features.events import prepare_post, prepare_report
from features.state import DEFAULT_LIMITS, load_state
from loadgen.posts import make_post
from streams.table_states import TableStates, use_event


class Event:
    """Stands in for a faust event: TableStates only makes it the current event."""

    def __init__(self, name: str):
        self.name = name


class RecordingTable(dict):
    """A table that remembers each write and under which current event it happened."""

    def __init__(self):
        super().__init__()
        self.writes: list[tuple[str, object]] = []

    def __setitem__(self, key, value):
        self.writes.append((key, current_event()))
        super().__setitem__(key, json.loads(json.dumps(value)))  # stored as a changelog would carry it


def posts(n: int, users: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [prepare_post(make_post(rng, f"p{i}", f"text {i % 3}", user_id=f"u{i % users}")) for i in range(n)]


def test_use_event_sets_fausts_current_event():
    e = Event("e")
    use_event(e)
    assert current_event() is e


def test_one_write_per_changed_key_under_the_last_event_that_changed_it():
    table = RecordingTable()
    batch = TableStates("user", table, DEFAULT_LIMITS)
    ctxs = posts(12, users=3)
    events = [Event(f"e{i}") for i in range(len(ctxs))]
    for event, ctx in zip(events, ctxs, strict=True):
        state = batch.state(ctx["user_id"], event)
        batch.done(ctx["user_id"], event, ("apply", "post", ctx), state.apply("post", ctx).changed)
    assert batch.flush() == 3 and len(table.writes) == 3
    last = {ctx["user_id"]: e for e, ctx in zip(events, ctxs, strict=True)}
    assert {key: event for key, event in table.writes} == last
    for user in ("u0", "u1", "u2"):
        assert load_state("user", table[user]).posts.count == 4


def test_the_batch_equals_one_event_at_a_time():
    ctxs = posts(30, users=4, seed=7)
    one_by_one: dict = {}
    for ctx in ctxs:
        state = load_state("user", one_by_one.get(ctx["user_id"]))
        state.apply("post", ctx)
        one_by_one[ctx["user_id"]] = json.loads(json.dumps(state.to_dict()))
    table = RecordingTable()
    batch = TableStates("user", table, DEFAULT_LIMITS)
    for start in range(0, len(ctxs), 7):  # batches of 7, the states cached between them
        for i, ctx in enumerate(ctxs[start:start + 7]):
            event = Event(f"e{start + i}")
            state = batch.state(ctx["user_id"], event)
            batch.done(ctx["user_id"], event, ("apply", "post", ctx), state.apply("post", ctx).changed)
        batch.flush()
    assert dict(table) == one_by_one


def test_a_failed_event_leaves_no_trace_and_keeps_the_batchs_earlier_events():
    table = RecordingTable()
    post = posts(1, users=1)[0]
    batch = TableStates("post", table, DEFAULT_LIMITS)
    e1, e2, e3 = Event("post"), Event("report-1"), Event("report-2")
    state = batch.state(post["post_id"], e1)
    batch.done(post["post_id"], e1, ("apply", "post", post), state.apply("post", post).changed)
    report = prepare_report({"report_id": "r1", "post_id": post["post_id"], "created_at": "2026-01-01T00:00:00Z"})
    state = batch.state(post["post_id"], e2)
    batch.done(post["post_id"], e2, ("apply", "report", report), state.apply("report", report).changed)
    # the next event changes the state, then fails before it is recorded as done
    bad = prepare_report({"report_id": "r2", "post_id": post["post_id"], "created_at": "2026-01-01T00:00:01Z"})
    batch.state(post["post_id"], e3).apply("report", bad)
    batch.rebuild(post["post_id"], e3)
    batch.flush()
    stored = load_state("post", table[post["post_id"]])
    assert stored.info is not None and stored.reports.count == 1  # r1 kept, r2 gone


def test_cached_states_are_read_once_and_never_share_data_with_what_was_written():
    table = RecordingTable()
    states = TableStates("user", table, DEFAULT_LIMITS)
    written: dict[str, str] = {}  # key -> the stored value as text when it was written
    for i, ctx in enumerate(posts(20, users=2, seed=3)):
        event = Event(f"e{i}")
        state = states.state(ctx["user_id"], event)
        states.done(ctx["user_id"], event, ("apply", "post", ctx), state.apply("post", ctx).changed)
        # the cached object has changed; what the table holds from earlier flushes has not
        assert {k: json.dumps(table[k], sort_keys=True) for k in written} == written
        states.flush()
        written[ctx["user_id"]] = json.dumps(table[ctx["user_id"]], sort_keys=True)
    assert states.loads == 2  # one decode per key, then the cached object
    assert load_state("user", table["u0"]).posts.count == 10


def test_a_dict_handed_to_the_table_is_not_changed_by_later_events():
    """faust serialises a changelog record after the write returns: the state must not alias the dict."""

    class KeepingTable(dict):
        def __setitem__(self, key, value):
            super().__setitem__(key, (value, json.dumps(value, sort_keys=True)))

        def get(self, key, default=None):
            item = super().get(key)
            return default if item is None else item[0]

    table = KeepingTable()
    states = TableStates("post", table, DEFAULT_LIMITS)
    post = posts(1, users=1)[0]
    e = Event("post")
    state = states.state(post["post_id"], e)
    states.done(post["post_id"], e, ("apply", "post", post), state.apply("post", post).changed)
    snapshot = {"post": {"post_id": post["post_id"], "user_id": "u0"}, "received_at_ms": 1, "revision": 1,
                "features": {"post_report_count": 0}}
    decision = {"post_id": post["post_id"], "user_id": "u0", "ip": None, "spam": False, "ts": 1, "revision": 1,
                "snapshot": snapshot}
    states.done(post["post_id"], e, ("apply", "decision", decision), state.apply("decision", decision).changed)
    states.flush()
    for i in range(3):  # reports push the post over the threshold: redecision() changes the snapshot in place
        report = prepare_report({"report_id": f"r{i}", "post_id": post["post_id"],
                                 "created_at": f"2026-01-01T00:00:0{i}Z"})
        event = Event(f"report-{i}")
        state = states.state(post["post_id"], event)
        states.done(post["post_id"], event, ("apply", "report", report), state.apply("report", report).changed)
        if state.redecision(3):
            states.done(post["post_id"], event, ("redecide", 3), True)
        value, text_at_write = table[post["post_id"]]
        assert json.dumps(value, sort_keys=True) == text_at_write
        states.flush()
    assert table[post["post_id"]][0]["snapshot"]["revision"] == 2


def test_invalidate_forgets_cached_states():
    table = RecordingTable()
    states = TableStates("user", table, DEFAULT_LIMITS)
    ctx = posts(1, users=1)[0]
    e = Event("e")
    states.state(ctx["user_id"], e)
    states.flush()
    table[ctx["user_id"]] = {**load_state("user", None).to_dict(), "reports": {"n": 5, "recent": [], "hwm": None}}
    assert states.state(ctx["user_id"], e).reports.count == 0  # cached
    states.flush()
    states.invalidate()
    assert states.state(ctx["user_id"], e).reports.count == 5  # read again
