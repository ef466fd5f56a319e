"""Table-state primitives (modpipe.features.state): idempotence, exactness within limits, JSON round trip."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from modpipe.features.events import prepare_ban, prepare_label, prepare_post, prepare_report
from modpipe.features.state import (
    DAY_MS,
    HOUR_MS,
    BanState,
    BoundedCounts,
    DedupCounter,
    DistinctSet,
    Limits,
    SlidingWindow,
    SpamMarks,
    UserState,
    load_state,
)

FAST = settings(max_examples=150, deadline=None, database=None)

events_st = st.lists(st.tuples(st.integers(0, 30), st.integers(0, 50)), max_size=80)  # (id, ts)


def roundtrip(obj, cls, *args):
    return cls.from_dict(json.loads(json.dumps(obj.to_dict())), *args)


@FAST
@given(events_st, st.integers(1, 8))
def test_dedup_never_double_counts(events, cap):
    # Event ids carry a stable timestamp, as real events do.
    events = [(f"e{i}", i * 7 % 50) for i, _ in events]
    c = DedupCounter(cap)
    for eid, ts in events:
        c.add(eid, ts)
    assert c.count <= len(set(events))
    before = c.to_dict()
    for eid, ts in events:  # replay everything: nothing changes, whatever was evicted
        assert not c.add(eid, ts)
    assert c.to_dict() == before


@FAST
@given(st.lists(st.integers(0, 40), max_size=80), st.integers(1, 8))
def test_dedup_exact_for_in_order_events(ids, cap):
    c = DedupCounter(cap)
    ordered = sorted(set(ids))
    for i in ordered:  # new events in (ts, id) order, each followed by a replay of a random earlier one
        c.add(f"{i:03d}", i)
        j = random.Random(i).choice(ordered[: ordered.index(i) + 1])
        c.add(f"{j:03d}", j)
        c = roundtrip(c, DedupCounter, cap)
    assert c.count == len(ordered)
    assert len(c.recent) <= cap


def test_dedup_twice_equals_once():
    a, b = DedupCounter(3), DedupCounter(3)
    for i in range(10):
        a.add(f"x{i}", i)
        b.add(f"x{i}", i)
        b.add(f"x{i}", i)
    assert a.to_dict() == b.to_dict() and a.count == 10 and b.hwm == [6, "x6"]


def test_distinct_set_caps():
    s = DistinctSet(cap=3)
    for m in "abcab":
        s.add(m)
    assert (s.count, s.saturated) == (3, False)
    assert not s.add("d") and s.saturated and s.count == 3
    assert roundtrip(s, DistinctSet, 3).to_dict() == s.to_dict()


@FAST
@given(st.lists(st.integers(0, 72 * 60), max_size=60), st.integers(0, 72 * 60))
def test_window_matches_brute_force(minutes, probe):
    w = SlidingWindow()
    times = sorted(m * 60_000 for m in minutes)
    for i, t in enumerate(times):
        w.add(t)
        w = SlidingWindow.from_dict(json.loads(json.dumps(w.to_dict())))
        for width in (HOUR_MS, DAY_MS):  # the count at each post, as the pipeline asks it
            assert w.count(t, width) == sum(1 for s in times[: i + 1] if t - width < s <= t)
    if times:
        t = max(times[-1] - HOUR_MS, probe * 60_000)  # a late post within the grace is still exact
        assert w.count(t, DAY_MS) == sum(1 for s in times if t - DAY_MS < s <= t)


def test_window_is_bounded():
    w = SlidingWindow(cap=10)
    for i in range(100):
        w.add(i * 1000)
    assert len(w.entries) == 10 and w.count(99_000, HOUR_MS) is None  # saturated: unknown, not 10
    assert w.count(99_000, 5_000) == 5
    w2 = SlidingWindow()
    for i in range(100):
        w2.add(i * HOUR_MS)
    assert len(w2.entries) == 25  # 24 h + 1 h grace behind the newest
    assert w2.count(99 * HOUR_MS, DAY_MS) == 24
    w2.add(10 * HOUR_MS)  # two days late: evicted at once, its own window is unknown
    assert w2.count(10 * HOUR_MS, HOUR_MS) is None


def test_bounded_counts_evicts_least_recent():
    b = BoundedCounts(cap=2)
    assert b.incr("a", 1) == 1 and b.incr("a", 2) == 2 and b.incr("b", 3) == 1
    b.incr("c", 4)  # evicts "a" (last seen at 2)
    assert (b.get("a"), b.get("b"), b.get("c")) == (0, 1, 1)
    assert roundtrip(b, BoundedCounts, 2).to_dict() == b.to_dict()


mark_st = st.tuples(st.sampled_from(["p1", "p2", "p3", "p4"]), st.sampled_from(["l", "d"]), st.integers(0, 5),
                    st.booleans())


def _expected_spam(marks):
    status = {}
    for pid in {m[0] for m in marks}:
        labels = [(ts, spam) for p, src, ts, spam in marks if p == pid and src == "l"]
        decisions = [(ts, spam) for p, src, ts, spam in marks if p == pid and src == "d"]
        status[pid] = max(labels)[1] if labels else max(decisions)[1]
    return sum(status.values())


@FAST
@given(st.lists(mark_st, max_size=30), st.randoms(use_true_random=False))
def test_spam_marks_order_independent_and_idempotent(marks, rnd):
    # One decision per post (the pipeline decides once); labels may flip any number of times.
    seen, unique = set(), []
    for m in marks:
        if m[1] == "d" and m[0] in seen:
            continue
        seen.add(m[0]) if m[1] == "d" else None
        unique.append(m)
    a = SpamMarks()
    for m in unique:
        a.apply(*m)
    shuffled = unique * 2
    rnd.shuffle(shuffled)
    b = SpamMarks()
    for m in shuffled:
        b.apply(*m)
        b = roundtrip(b, SpamMarks)
    assert a.count == b.count == _expected_spam(unique)
    assert a.to_dict() == b.to_dict()


def test_spam_marks_bounded_and_replay_safe():
    s = SpamMarks(cap=2)
    events = [(f"p{i}", "l", i, True) for i in range(5)]
    for e in events:
        s.apply(*e)
    assert s.count == 5 and len(s.marks) == 2 and s.base == 3
    for e in events:  # replays of evicted posts are recognised by the mark
        assert not s.apply(*e)
    assert s.count == 5
    s.apply("p4", "l", 9, False)  # a moderator flips a kept post to ham
    assert s.count == 4


def post(pid, user="u1", ts="2024-05-01T10:00:00Z", url="http://a.com/x", text="hi", ip="1.2.3.4"):
    return prepare_post({"post_id": pid, "user_id": user, "created_at": ts, "url": url, "text": text, "ip": ip})


def test_user_state_counts_and_idempotence():
    s = UserState()
    f1 = s.apply("post", post("p1")).features
    assert f1["user_posts"] == 1 and f1["user_link_count"] == 1 and f1["user_post_count"] == 1
    assert s.apply("post", post("p1")).changed is False
    f2 = s.apply("post", post("p2", ts="2024-05-01T10:30:00Z", url=None, text="HI")).features
    assert (f2["user_posts"], f2["user_posts_1h"], f2["user_link_count"], f2["user_post_count"]) == (2, 2, None, 2)
    f3 = s.apply("post", post("p3", ts="2024-05-01T11:15:00Z")).features
    assert (f3["user_posts_1h"], f3["user_posts_24h"], f3["user_link_count"]) == (2, 3, 2)
    rep = prepare_report({"report_id": "r1", "post_id": "p1", "reported_user_id": "u1",
                          "created_at": "2024-05-01T12:00:00Z"})
    assert s.apply("report", rep).changed and not s.apply("report", rep).changed
    lab = prepare_label({"post_id": "p1", "user_id": "u1", "label": "spam", "created_at": "2024-05-01T12:00:00Z"})
    assert s.apply("label", lab).changed and not s.apply("label", lab).changed
    f4 = s.apply("post", post("p4", ts="2024-05-01T12:30:00Z")).features
    assert f4["user_spam_posts"] == 1 and f4["user_report_count"] == 1 and f4["user_spam_report"] is True
    again = load_state("user", json.loads(json.dumps(s.to_dict())))
    assert again.to_dict() == s.to_dict()
    assert s.apply("ban", {}).changed is False  # kinds a table does not track are no-ops


def test_ban_state_newest_wins_any_order():
    events = [prepare_ban({"ban_id": f"b{i}", "kind": "domain", "value": "Evil.com", "action": a,
                           "created_at": f"2024-05-01T10:0{i}:00Z"}) for i, a in enumerate(["ban", "unban", "ban"])]
    assert events[0]["key"] == "domain:evil.com"
    for order in (events, events[::-1], events[1:] + events[:1]):
        s = BanState()
        for e in order + order:
            s.apply("ban", e)
        assert s.banned and s.last[1] == "b2"


def test_limits_are_respected_by_table_states():
    limits = Limits(dedup_ids=4, per_user_keys=3)
    s = UserState(limits)
    for i in range(20):
        s.apply("post", post(f"p{i:02d}", ts=f"2024-05-01T10:{i:02d}:00Z", url=f"http://a.com/{i}", text=f"t{i}x"))
        s = load_state("user", json.loads(json.dumps(s.to_dict())), limits)
    d = s.to_dict()
    assert s.posts.count == 20 and len(d["posts"]["recent"]) == 4 and len(d["links"]) == 3
    assert len(d["texts"]) == 1  # all texts share a fingerprint (digits folded)


# ------------------------------------------------------------------ re-decision (snapshot in the post table)

def _decided(pid="p1", report_count=0, domain_banned=False):
    """A post table holding the post and the snapshot of its first decision."""
    from modpipe.features.events import POST, prepare_decision
    from modpipe.features.offline import DictStore, apply_event

    store = DictStore()
    ctx = post(pid, url="http://login.evil.com/x")
    apply_event("post", ctx, store)
    snapshot = {"post": {"post_id": pid, "user_id": "u1"}, "received_at_ms": 5, "revision": 1,
                "features": {"post_report_count": report_count, "domain_banned": domain_banned, "user_age": 3.0}}
    apply_event("decision", {**prepare_decision(ctx, False), "snapshot": snapshot}, store)
    return store, store.get(POST, pid)


def _report(i, pid="p1"):
    return prepare_report({"report_id": f"r{i}", "post_id": pid, "created_at": f"2024-05-01T10:0{i}:00Z"})


def test_reports_reaching_the_threshold_redecide_once():
    store, state = _decided()
    for i in range(2):
        state.apply("report", _report(i))
        assert state.redecision(3) is None
    state.apply("report", _report(2))
    req = state.redecision(3)
    assert req["reason"] == "reports" and req["revision"] == 2
    assert req["features"] == {"post_report_count": 3, "domain_banned": False, "user_age": 3.0}
    assert req["post"] == {"post_id": "p1", "user_id": "u1"} and req["received_at_ms"] == 5
    state.apply("report", _report(3))
    assert state.redecision(3) is None  # once per reason
    state = load_state("post", json.loads(json.dumps(state.to_dict())))
    state.apply("report", _report(2))  # a redelivered report after a restart
    assert state.redecision(3) is None
    assert state.redecision(0) is None  # 0 disables report re-decisions


@pytest.mark.parametrize("text_back_first", [False, True])
def test_reports_during_an_outage_never_share_a_revision_with_the_text_models_redecision(text_back_first):
    """A degraded decision (revision 1) is decided again from posts.awaiting-text with revision 2 once Triton
    answers; reports crossing the threshold re-decide it from the snapshot. Whichever reaches the post state first,
    the two re-decisions carry different revisions (the chaos test once saw revision 2 published twice)."""
    from modpipe.features.events import prepare_decision

    store, state = _decided()
    state.snapshot["degraded"] = True
    published = [1]
    if text_back_first:  # the awaiting-text decision's feedback arrives before the reports
        published.append(2)
        snap = {**state.snapshot, "revision": 2, "degraded": False}
        state.apply("decision", {**prepare_decision(post("p1", url="http://login.evil.com/x"), False), "snapshot": snap})
    for i in range(3):
        state.apply("report", _report(i))
    published.append(state.redecision(3)["revision"])
    if not text_back_first:
        published.append(1 + 1)  # the awaiting-text path: the degraded decision's revision + 1
    assert len(published) == len(set(published)) == 3, published


def test_threshold_already_reached_when_the_decision_arrives():
    from modpipe.features.events import POST, prepare_decision
    from modpipe.features.offline import DictStore, apply_event

    store = DictStore()
    ctx = post("p2")
    apply_event("post", ctx, store)
    for i in range(3):
        apply_event("report", _report(i, "p2"), store)
    state = store.get(POST, "p2")
    assert state.redecision(3) is None  # nothing decided yet: nothing to decide again
    snap = {"post": {"post_id": "p2", "user_id": "u1"}, "received_at_ms": 1, "revision": 1,
            "features": {"post_report_count": 0}}
    state.apply("decision", {**prepare_decision(ctx, False), "snapshot": snap})
    assert state.redecision(3)["features"]["post_report_count"] == 3


def test_a_later_domain_ban_reaches_the_posts_it_covers():
    from modpipe.features.events import DOMAIN, POST
    from modpipe.features.offline import apply_event

    store, _ = _decided("p1")
    other = post("p3", url="http://www.evil.com/y")
    apply_event("post", other, store)
    ban = prepare_ban({"ban_id": "b1", "kind": "domain", "value": "login.evil.com", "action": "ban",
                       "created_at": "2024-05-01T11:00:00Z"})
    assert ban["domain"] == "evil.com" and ban["host"] == "login.evil.com"
    apply_event("ban", ban, store)
    assert store.get(POST, "p1").ban == "domain:login.evil.com"
    assert store.get(POST, "p3").ban is None  # www.evil.com is not under login.evil.com
    req = store.get(POST, "p1").redecision(3)
    assert req["reason"] == "domain_banned" and req["features"]["domain_banned"] is True
    # applying the same ban again reaches no post: a redelivery re-decides nothing twice
    assert store.get(DOMAIN, "evil.com").apply("ban", ban).followups == []


def test_a_post_decided_with_its_domain_already_banned_is_not_redecided():
    from modpipe.features.events import POST
    from modpipe.features.offline import apply_event

    store, _ = _decided("p1", domain_banned=True)
    apply_event("ban", prepare_ban({"ban_id": "b1", "kind": "domain", "value": "evil.com", "action": "ban",
                                    "created_at": "2024-05-01T11:00:00Z"}), store)
    assert store.get(POST, "p1").redecision(3) is None


def test_a_domains_recent_posts_are_the_newest_whatever_order_they_arrived_in():
    """A domain keeps the `recent_posts` newest posts by (created_at, post_id) for a later ban to re-decide: which
    stay must not depend on arrival order, or a restore, a replay and features.offline keep different ones (seen:
    a 22,500-post chaos run whose domain table differed from features.offline in one of 256 recent posts)."""
    from modpipe.features.events import DOMAIN
    from modpipe.features.offline import DictStore, apply_event

    cap = Limits().recent_posts
    posts = [post(f"p{i}", user=f"u{i}", ts=f"2024-05-01T{10 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z",
                  url=f"http://s{i % 3}.spam.example/x{i}") for i in range(cap + 60)]
    states = []
    for seed in range(3):
        order = list(posts)
        random.Random(seed).shuffle(order)
        store = DictStore()
        for p in order:
            apply_event("post", p, store)
        states.append(json.loads(json.dumps(store.get(DOMAIN, "spam.example").to_dict())))
    assert states[0] == states[1] == states[2]
    assert sorted(e[0] for e in states[0]["recent"]) == sorted(f"p{i}" for i in range(60, cap + 60))


def test_a_domain_state_written_before_recent_posts_had_their_time_still_loads():
    from modpipe.features.state import DomainState

    s = DomainState.from_dict({"posts": {"n": 2, "recent": [], "hwm": None}, "reports": {"n": 0, "recent": [], "hwm": None},
                               "recent": [["p9", "a.spam.example"], ["p1", "b.spam.example"]], "bans": []})
    s.apply("post", post("p2", url="http://a.spam.example/y"))
    assert [e[0] for e in s.recent] == ["p1", "p9", "p2"]  # the old ones count as the oldest
    ban = {"banned": True, "host": "spam.example", "ts": 5, "key": "b1"}
    assert sorted(f[1] for f in s.apply_ban(ban).followups) == ["p1", "p2", "p9"]
