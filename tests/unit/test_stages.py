"""streams.stages without Kafka: the chain of stages (user -> link -> ip -> post) with items passed
through an in-memory queue computes exactly what features.offline computes, and a failed item leaves
no trace."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from features import events as fe
from features.offline import compute, prepare_decision_event
from features.state import DEFAULT_LIMITS, load_state
from streams.stages import Stage, decision_items, event_items, post_item
from tests.unit.test_features_offline import make_events, with_redeliveries


class Event:
    """Stands in for the record a bundle came in: the stages hand it to the table states, which read and write
    under its partition (`event.message.partition`); the plain dict tables here do not look at it."""


class Harness:
    """Every stage of one partition, a FIFO queue between them, and the decision feedback."""

    def __init__(self, decide=None, redecide_reports: int = 0):
        self.tables = {t: {} for t in fe.TABLES}
        self.bans: dict = {}
        self.stages = {name: Stage(name, self.tables, DEFAULT_LIMITS, is_banned=self.is_banned,
                                   redecide_reports=redecide_reports) for name in fe.STAGES}
        self.queue: collections.deque = collections.deque()
        self.features: dict[str, dict] = {}
        self.decide = decide
        self.redecisions = []
        self.hops = collections.Counter()

    def is_banned(self, key: str) -> bool:
        state = self.bans.get(key)
        return bool(state and state.banned)

    def send(self, kind: str, raw: dict) -> None:
        if kind == "post":
            self.queue.append(post_item(raw, 0))
        else:
            ctx = prepare_decision_event(raw) if kind == "decision" else fe.PREPARE[kind](raw)
            if kind == "ban" and ctx["key"]:  # what every worker's BanRegistry does
                state = self.bans.get(ctx["key"]) or load_state(fe.BANS, None)
                state.apply("ban", ctx)
                self.bans[ctx["key"]] = state
            self.queue.extend(event_items(kind, ctx))
        self.settle()

    def settle(self) -> None:
        while self.queue:
            stage, _pkey, item = self.queue.popleft()
            self.hops[stage] += 1
            out = self.stages[stage].apply(item, Event())
            self.stages[stage].flush()
            self.queue.extend(out.items)
            self.redecisions += out.redecisions
            for post in out.ready:
                self.features.setdefault(post.ctx["post_id"], post.features)
                if self.decide is not None:
                    spam = self.decide(post.post, post.features)
                    self.queue.extend(decision_items(post.ctx, spam, 1, {"post": {}, "received_at_ms": 0,
                                                                        "features": post.features, "revision": 1}))


@settings(max_examples=25, deadline=None, database=None)
@given(st.integers(0, 10**9))
def test_the_chain_of_stages_computes_the_offline_features(seed):
    events = make_events(seed)
    h = Harness()
    for kind, raw in events:
        h.send(kind, raw)
    assert h.features == compute(events).features


@settings(max_examples=15, deadline=None, database=None)
@given(st.integers(0, 10**9))
def test_redelivered_items_count_nothing_twice(seed):
    events = make_events(seed)
    h = Harness()
    for kind, raw in with_redeliveries(events, seed):
        h.send(kind, raw)
    assert h.features == compute(events).features


def test_decisions_are_fed_back_like_offline():
    events = make_events(11, n=90)
    verdicts = {}

    def decide(post, features):
        return verdicts.setdefault(post["post_id"], hash(post["post_id"]) % 3 == 0)

    h = Harness(decide=decide)
    for kind, raw in events:
        h.send(kind, raw)
    assert h.features == compute(events, decide=decide).features


def test_a_post_visits_only_the_stages_it_has_keys_for():
    h = Harness()
    h.send("post", {"post_id": "p1", "user_id": "u1", "ip": "10.0.0.1", "url": "http://a.com/x", "text": "hi",
                    "created_at": "2026-01-01T00:00:00Z"})
    assert h.hops == {"user": 1, "link": 1, "ip": 1, "post": 1}  # url and domain counted in one hop
    h.hops.clear()
    h.send("post", {"post_id": "p2", "user_id": "u1", "ip": None, "text": "no link",
                    "created_at": "2026-01-01T00:01:00Z"})
    assert h.hops == {"user": 1, "post": 1}
    assert h.features["p2"]["user_posts"] == 2 and h.features["p1"]["url_post_count"] == 1


def test_url_keys_are_placed_by_their_domain():
    _, _, item = post_item({"post_id": "p", "user_id": "u", "ip": "10.0.0.1", "text": "x",
                            "url": "https://login.evil.com/a?b=1", "created_at": "2026-01-01T00:00:00Z"}, 0)
    link = next(hop for hop in item["route"] if hop[0] == "link")
    assert link[1] == "evil.com" and [t for t, _ in link[2]] == ["url", "domain"]
    engagement = fe.prepare_engagement({"engagement_id": "e", "post_id": "p", "kind": "share",
                                        "url": "https://login.evil.com/a?b=1"})
    (stage, pkey, _), _ = event_items("engagement", engagement)
    assert (stage, pkey) == ("link", "evil.com")  # the url state it updates lives on that partition


def test_reports_reaching_the_threshold_ask_for_a_redecision():
    h = Harness(decide=lambda post, features: False, redecide_reports=2)
    h.send("post", {"post_id": "p1", "user_id": "u1", "ip": "10.0.0.1", "text": "hi",
                    "created_at": "2026-01-01T00:00:00Z"})
    for i in range(3):
        h.send("report", {"report_id": f"r{i}", "post_id": "p1", "reporter_id": "x", "reported_user_id": "u1",
                          "reason": "spam", "created_at": f"2026-01-01T00:0{i + 1}:00Z"})
    assert len(h.redecisions) == 1  # once per reason
    r = h.redecisions[0]
    assert r.post_id == "p1" and r.request["revision"] == 2 and r.request["features"]["post_report_count"] == 2
    assert r.ctx["user_id"] == "u1" and r.ctx["ip"] == "10.0.0.1"


def test_a_failed_item_leaves_no_trace_and_sends_nothing():
    tables = {t: {} for t in fe.TABLES}
    stage = Stage("link", tables, DEFAULT_LIMITS, is_banned=lambda key: False)
    _, _, item = post_item({"post_id": "p", "user_id": "u", "ip": "10.0.0.1", "text": "x",
                            "url": "http://a.com/x", "created_at": "2026-01-01T00:00:00Z"}, 0)
    link_hop = item["route"].pop(0)
    item["to"] = link_hop[2]
    good = {**item, "counts": {}, "route": [list(h) for h in item["route"]]}
    event = Event()
    stage.apply(good, event)
    bad = {**item, "ctx": {**item["ctx"], "post_id": "q"}, "counts": {}, "route": [list(h) for h in item["route"]],
           "to": [["url", item["to"][0][1]], ["ip", "10.0.0.1"]]}  # not a table of this stage
    with pytest.raises(Exception):  # noqa: B017 - whatever breaks, the url state must come back
        stage.apply(bad, event)
    stage.flush()
    url_state = load_state("url", tables["url"][item["to"][0][1]])
    assert url_state.posts.count == 1  # p counted, q (failed half-way) not
