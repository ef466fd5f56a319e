"""modpipe.streams.state.table_states: a stage's state handling across batches. `TableStates` reads a key's state with
`read(key, event)` and writes each changed state once per batch with `write(key, value, event, pending)` (by
default a dict's `get` and item assignment); `ChangelogWriter` is the worker's read/write pair: the table
partition of the event in hand, and a changelog record into the outbox's open transaction."""

from __future__ import annotations

import json
import random

import orjson
from modpipe.features.events import prepare_post, prepare_report
from modpipe.features.state import DEFAULT_LIMITS, load_state
from modpipe.loadgen.posts import make_post
from modpipe.streams.kafka.records import Record
from modpipe.streams.state.table_states import ChangelogWriter, TableStates
from modpipe.streams.state.tables import Table


def event(partition: int = 0, offset: int = 0) -> Record:
    """A stage-topic record: the states only look at `event.message.partition`."""
    return Record("features.user", partition, offset, None, None)


class RecordingStore:
    """read/write for TableStates that keeps each write (key, event, pending) and stores the value as a
    changelog record would carry it (its JSON, taken when the write happens)."""

    def __init__(self):
        self.values: dict[str, dict] = {}
        self.writes: list[tuple[str, object, object]] = []

    def read(self, key, event):
        return self.values.get(key)

    def write(self, key, value, event, pending):
        self.writes.append((key, event, pending))
        self.values[key] = json.loads(json.dumps(value))


def states_of(table_name: str, store: RecordingStore, **kwargs) -> TableStates:
    return TableStates(table_name, None, DEFAULT_LIMITS, write=store.write, read=store.read, **kwargs)


def posts(n: int, users: int, seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    return [prepare_post(make_post(rng, f"p{i}", f"text {i % 3}", user_id=f"u{i % users}")) for i in range(n)]


def apply_post(states: TableStates, key: str, ev, ctx: dict) -> None:
    state = states.state(key, ev)
    states.done(key, ev, ("apply", "post", ctx), state.apply("post", ctx).changed)


def test_one_write_per_changed_key_under_the_last_event_that_changed_it():
    store = RecordingStore()
    states = states_of("user", store)
    ctxs = posts(12, users=3)
    events = [event(offset=i) for i in range(len(ctxs))]
    for ev, ctx in zip(events, ctxs, strict=True):
        apply_post(states, ctx["user_id"], ev, ctx)
    pending = object()
    assert states.flush(pending) == 3 and len(store.writes) == 3
    last = {ctx["user_id"]: ev for ev, ctx in zip(events, ctxs, strict=True)}
    assert {key: ev for key, ev, _ in store.writes} == last
    assert all(p is pending for _, _, p in store.writes)  # the checkpoint's group holds every changelog record
    for user in ("u0", "u1", "u2"):
        assert load_state("user", store.values[user]).posts.count == 4
    assert states.flush() == 0  # nothing changed since


def test_without_a_writer_the_states_go_to_a_dict():
    table: dict = {}
    states = TableStates("user", table, DEFAULT_LIMITS)
    ctx = posts(1, users=1)[0]
    apply_post(states, ctx["user_id"], event(), ctx)
    assert states.flush() == 1 and load_state("user", table["u0"]).posts.count == 1


def test_the_batch_equals_one_event_at_a_time():
    ctxs = posts(30, users=4, seed=7)
    one_by_one: dict = {}
    for ctx in ctxs:
        state = load_state("user", one_by_one.get(ctx["user_id"]))
        state.apply("post", ctx)
        one_by_one[ctx["user_id"]] = json.loads(json.dumps(state.to_dict()))
    store = RecordingStore()
    states = states_of("user", store)
    for start in range(0, len(ctxs), 7):  # batches of 7, the states cached between them
        for i, ctx in enumerate(ctxs[start:start + 7]):
            apply_post(states, ctx["user_id"], event(offset=start + i), ctx)
        states.flush()
    assert store.values == one_by_one


def test_a_failed_event_leaves_no_trace_and_keeps_the_batchs_earlier_events():
    store = RecordingStore()
    post = posts(1, users=1)[0]
    states = states_of("post", store)
    e1, e2, e3 = event(offset=1), event(offset=2), event(offset=3)
    apply_post(states, post["post_id"], e1, post)
    report = prepare_report({"report_id": "r1", "post_id": post["post_id"], "created_at": "2026-01-01T00:00:00Z"})
    state = states.state(post["post_id"], e2)
    states.done(post["post_id"], e2, ("apply", "report", report), state.apply("report", report).changed)
    # the next event changes the state, then fails before it is recorded as done
    bad = prepare_report({"report_id": "r2", "post_id": post["post_id"], "created_at": "2026-01-01T00:00:01Z"})
    states.state(post["post_id"], e3).apply("report", bad)
    states.rebuild(post["post_id"], e3)
    states.flush()
    stored = load_state("post", store.values[post["post_id"]])
    assert stored.info is not None and stored.reports.count == 1  # r1 kept, r2 gone
    assert [ev for _, ev, _ in store.writes] == [e2]  # the failed event wrote nothing


def test_cached_states_are_read_once_and_never_share_data_with_what_was_written():
    store = RecordingStore()
    states = states_of("user", store)
    written: dict[str, str] = {}  # key -> the stored value as text when it was written
    for i, ctx in enumerate(posts(20, users=2, seed=3)):
        apply_post(states, ctx["user_id"], event(offset=i), ctx)
        # the cached object has changed; what the store holds from earlier flushes has not
        assert {k: json.dumps(store.values[k], sort_keys=True) for k in written} == written
        states.flush()
        written[ctx["user_id"]] = json.dumps(store.values[ctx["user_id"]], sort_keys=True)
    assert states.loads == 2  # one decode per key, then the cached object
    assert load_state("user", store.values["u0"]).posts.count == 10


def test_a_dict_handed_to_the_writer_is_not_changed_by_later_events():
    """The in-memory table keeps the very dict it is given (modpipe.streams.state.tables.Table.set), and a rebuild reads it
    back: the cached state must not alias it."""
    kept: dict[str, tuple[dict, str]] = {}

    def write(key, value, event, pending):
        kept[key] = (value, json.dumps(value, sort_keys=True))

    states = TableStates("post", None, DEFAULT_LIMITS, write=write,
                         read=lambda key, event: kept[key][0] if key in kept else None)
    post = posts(1, users=1)[0]
    e = event()
    apply_post(states, post["post_id"], e, post)
    snapshot = {"post": {"post_id": post["post_id"], "user_id": "u0"}, "received_at_ms": 1, "revision": 1,
                "features": {"post_report_count": 0}}
    decision = {"post_id": post["post_id"], "user_id": "u0", "ip": None, "spam": False, "ts": 1, "revision": 1,
                "snapshot": snapshot}
    state = states.state(post["post_id"], e)
    states.done(post["post_id"], e, ("apply", "decision", decision), state.apply("decision", decision).changed)
    states.flush()
    for i in range(3):  # reports push the post over the threshold: redecision() changes the snapshot in place
        report = prepare_report({"report_id": f"r{i}", "post_id": post["post_id"],
                                 "created_at": f"2026-01-01T00:00:0{i}Z"})
        ev = event(offset=i + 1)
        state = states.state(post["post_id"], ev)
        states.done(post["post_id"], ev, ("apply", "report", report), state.apply("report", report).changed)
        if state.redecision(3):
            states.done(post["post_id"], ev, ("redecide", 3), True)
        value, text_at_write = kept[post["post_id"]]
        assert json.dumps(value, sort_keys=True) == text_at_write
        states.flush()
    assert kept[post["post_id"]][0]["snapshot"]["revision"] == 2


def test_invalidate_forgets_cached_states():
    store = RecordingStore()
    states = states_of("user", store)
    ctx = posts(1, users=1)[0]
    e = event()
    states.state(ctx["user_id"], e)
    states.flush()
    store.values[ctx["user_id"]] = {**load_state("user", None).to_dict(), "reports": {"n": 5, "recent": [], "hwm": None}}
    assert states.state(ctx["user_id"], e).reports.count == 0  # cached
    states.flush()
    states.invalidate()
    assert states.state(ctx["user_id"], e).reports.count == 5  # read again


def test_the_cache_keeps_the_most_recently_used_keys():
    store = RecordingStore()
    states = states_of("user", store, cached_keys=2)
    ctxs = posts(3, users=3)
    for ctx in ctxs:  # u0, u1, u2: u0 is evicted once the batch is over
        apply_post(states, ctx["user_id"], event(), ctx)
    states.flush()
    assert states.loads == 3
    states.state("u2", event())
    states.state("u1", event())
    assert states.loads == 3
    states.state("u0", event())  # decoded again from the store
    assert states.loads == 4


class FakeOutbox:
    def __init__(self):
        self.records: list[tuple] = []

    def produce(self, topic, value, *, key=None, partition=None, pending=None, **kwargs):
        self.records.append((topic, value, key, partition, pending))


def test_the_changelog_writer_uses_the_table_partition_of_the_event_and_writes_a_changelog_record():
    table = Table("user", "app-features-user-changelog")
    box = FakeOutbox()
    writer = ChangelogWriter(table, box)
    pending = object()
    writer("u1", {"n": 1}, event(partition=2), pending)
    assert table.decoded() == {2: {"u1": {"n": 1}}}
    assert writer.read("u1", event(partition=2)) == {"n": 1}
    assert writer.read("u1", event(partition=0)) is None  # another partition's key
    assert box.records == [("app-features-user-changelog", orjson.dumps({"n": 1}), orjson.dumps("u1"), 2, pending)]


def test_the_changelog_writer_counts_the_bytes_of_each_state_it_writes():
    from prometheus_client import REGISTRY

    def written() -> float:
        return REGISTRY.get_sample_value("modpipe_state_written_bytes_total", {"table": "user"}) or 0.0

    table = Table("user", "app-features-user-changelog")
    box = FakeOutbox()
    writer = ChangelogWriter(table, box)
    before = written()
    writer("u1", {"n": 1, "recent": list(range(100))}, event(partition=0), None)
    writer("u1", {"n": 2}, event(partition=0), None)  # the same key again: its whole state again
    assert written() - before == sum(len(r[1]) for r in box.records) > 300
    writer.expire(None)  # a tombstone carries no state (and this table has no retention: none written)
    assert written() - before == sum(len(r[1]) for r in box.records)


def test_table_states_over_a_changelog_writer_keep_partitions_apart():
    table = Table("user", "app-features-user-changelog")
    box = FakeOutbox()
    writer = ChangelogWriter(table, box)
    states = TableStates("user", table, DEFAULT_LIMITS, write=writer, read=writer.read)
    ctxs = posts(4, users=2)
    for i, ctx in enumerate(ctxs):
        apply_post(states, ctx["user_id"], event(partition=1 if ctx["user_id"] == "u1" else 3, offset=i), ctx)
    assert states.flush("checkpoint") == 2
    assert sorted(table.partitions) == [1, 3]
    assert load_state("user", table.get("u1", 1)).posts.count == 2 and table.get("u1", 3) is None
    assert sorted((r[3], orjson.loads(r[2])) for r in box.records) == [(1, "u1"), (3, "u0")]
    assert all(r[4] == "checkpoint" for r in box.records)


def states_with_retention(retention_ms: int, now: list[int]):
    """A user table with a retention on the clock `now[0]`, its changelog outbox and its TableStates."""
    table = Table("user", "app-features-user-changelog", retention_ms=retention_ms, clock=lambda: now[0])
    box = FakeOutbox()
    writer = ChangelogWriter(table, box)
    return table, box, TableStates("user", table, DEFAULT_LIMITS, write=writer, read=writer.read)


def test_expiry_forgets_the_cached_state_and_writes_a_tombstone_in_the_checkpoint():
    now = [1_000_000]
    table, box, states = states_with_retention(60_000, now)
    ctxs = posts(4, users=2)  # u0 and u1, two posts each
    apply_post(states, "u0", event(partition=1, offset=0), ctxs[0])
    states.flush("first")
    now[0] += 30_000
    apply_post(states, "u1", event(partition=1, offset=1), ctxs[1])
    states.flush("second")
    assert states.expire("second") == 0  # u0 is 30 s old
    now[0] += 30_000
    box.records.clear()
    assert states.expire("third") == 1
    assert box.records == [("app-features-user-changelog", None, orjson.dumps("u0"), 1, "third")]
    assert table.decoded() == {1: {"u1": load_state("user", table.get("u1", 1)).to_dict()}}
    # u0 was cached: a new post of u0 starts from an empty state, not from the cached one
    apply_post(states, "u0", event(partition=1, offset=2), ctxs[2])
    states.flush("fourth")
    assert load_state("user", table.get("u0", 1)).posts.count == 1


def test_a_key_written_in_the_checkpoint_is_not_expired_by_it():
    now = [0]
    table, _, states = states_with_retention(1_000, now)
    ctxs = posts(2, users=1)
    apply_post(states, "u0", event(partition=0, offset=0), ctxs[0])
    states.flush()
    now[0] += 5_000
    apply_post(states, "u0", event(partition=0, offset=1), ctxs[1])  # old, but written again in this checkpoint
    states.flush()
    assert states.expire() == 0 and load_state("user", table.get("u0", 0)).posts.count == 2


def test_a_plain_dict_table_has_no_retention():
    states = TableStates("user", {}, DEFAULT_LIMITS)
    assert states.expire() == 0


def _simulated_states() -> dict[str, list[bytes]]:
    """Each table's states, encoded, after a simulated platform's events (with decisions fed back)."""
    from modpipe.features.offline import compute
    from modpipe.simulation.simulator import simulate

    texts = ([{"text": f"WINNER!! You won a {i}000 prize, call 0906{i:04d} now", "label": 1, "dataset": "sms"}
              for i in range(12)]
             + [{"text": f"are we still on for lunch on day {i}?", "label": 0, "dataset": "sms"} for i in range(12)])
    events = [(e.kind, e.payload) for e in simulate(texts, 1500, "mixed", seed=4) if e.kind != "ban"]
    dump = compute(events, decide=lambda post, features: features.get("user_post_count_24h", 0) > 3).store.dump()
    return {table: [orjson.dumps(v) for v in rows.values()] for table, rows in dump.items()}


def test_a_decoded_states_estimate_is_above_what_it_allocates_and_within_3x():
    import tracemalloc

    from modpipe.streams.state.table_states import decoded_bytes

    checked = 0
    for table, encoded in _simulated_states().items():
        if table not in ("user", "url", "domain", "ip", "post") or not encoded:
            continue
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        states = [load_state(table, orjson.loads(e), DEFAULT_LIMITS) for e in encoded]
        allocated = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        estimated = sum(decoded_bytes(len(e)) for e in encoded)
        assert allocated <= estimated <= 3 * allocated, (table, len(states), allocated, estimated)
        checked += 1
    assert checked == 5


def test_the_cache_keeps_states_by_their_bytes_once_a_flush_measured_them():
    store = RecordingStore()

    def write(key, value, event, pending):
        store.write(key, value, event, pending)
        return 10_000  # each state's encoding: a decoded one is estimated at decoded_bytes(10,000)
    from modpipe.streams.state.table_states import decoded_bytes

    states = TableStates("user", None, DEFAULT_LIMITS, write=write, read=store.read,
                         cache_bytes=5 * decoded_bytes(10_000))
    ctxs = posts(20, users=20)
    for i, ctx in enumerate(ctxs):
        apply_post(states, ctx["user_id"], event(offset=i), ctx)
    assert states.batch_bytes == 20 * states.state_bytes  # the batch holds every state until the flush
    states.flush()
    assert states.state_bytes == decoded_bytes(10_000)
    assert states.cached_max == 5 and len(states._cache) == 5
    assert states.batch_bytes == 0
