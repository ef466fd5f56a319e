"""modpipe.streams.moderation.stages without Kafka: the chain of stages (user -> link -> ip -> post) with items passed
through an in-memory queue computes exactly what modpipe.features.offline computes, and a failed item leaves
no trace."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from modpipe.features import events as fe
from modpipe.features.offline import compute, prepare_decision_event
from modpipe.features.state import DEFAULT_LIMITS, RESENT, Limits, load_state
from modpipe.streams.moderation.stages import Stage, decision_items, event_items, post_item

from tests.unit.test_features_offline import backdated_events, make_events, with_redeliveries


class Event:
    """Stands in for the record a bundle came in: the stages hand it to the table states, which read and write
    under its partition (`event.message.partition`); the plain dict tables here do not look at it."""


class Harness:
    """Every stage of one partition, a FIFO queue between them, and the decision feedback."""

    def __init__(self, decide=None, redecide_reports: int = 0, limits: Limits = DEFAULT_LIMITS):
        self.tables = {t: {} for t in fe.TABLES}
        self.bans: dict = {}
        self.stages = {name: Stage(name, self.tables, limits, is_banned=self.is_banned,
                                   redecide_reports=redecide_reports) for name in fe.STAGES}
        self.held: list = []  # items `hold` kept back, as a partition whose worker stands still does
        self.hold = lambda stage, item: False
        self.queue: collections.deque = collections.deque()
        self.features: dict[str, dict] = {}
        self.decide = decide
        self.redecisions = []
        self.hops = collections.Counter()
        self.decided = collections.Counter()  # post id -> posts handed on to be decided
        self.resent = 0
        self.checked = 0  # posts sent to the post table first (their first table could not tell)

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
            if self.hold(stage, item):
                self.held.append((stage, _pkey, item))
                continue
            self.hops[stage] += 1
            out = self.stages[stage].apply(item, Event())
            self.stages[stage].flush()
            self.queue.extend(out.items)
            self.redecisions += out.redecisions
            self.resent += out.resent
            self.checked += getattr(out, "checked", 0)
            for post in out.ready:
                self.decided[post.ctx["post_id"]] += 1
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


@settings(max_examples=15, deadline=None, database=None)
@given(st.integers(0, 10**9))
def test_a_post_sent_again_is_decided_once(seed):
    """A platform's producer that re-sends (librdkafka's idempotent producer after an epoch bump writes the
    in-flight records again) must not get a second decision of the same post."""
    events = make_events(seed)
    h = Harness()
    sent = collections.Counter()
    for kind, raw in with_redeliveries(events, seed):
        if kind == "post":
            sent[raw["post_id"]] += 1
        h.send(kind, raw)
    assert set(h.decided) == set(sent) and set(h.decided.values()) == {1}
    assert h.resent == sum(sent.values()) - len(sent) > 0


@settings(max_examples=15, deadline=None, database=None)
@given(st.integers(0, 10**9))
def test_posts_below_a_small_id_window_go_the_offline_way(seed):
    """A window of 2 ids sends most posts and re-deliveries to the post table first: the chain still computes
    offline's features and tables, and decides each post once."""
    events = with_redeliveries(make_events(seed), seed)
    limits = Limits(dedup_ids=2)
    h = Harness(limits=limits)
    for kind, raw in events:
        h.send(kind, raw)
    offline = compute(events, limits=limits)
    assert h.features == offline.features
    assert h.decided == offline.decided and set(h.decided.values()) == {1}
    dump = offline.store.dump()
    for table in fe.TABLES:  # (the harness keeps the bans apart, as every worker does)
        # offline also stores a key an event left as new (a like on a url): the stages write changed states only
        empty = load_state(table, None).to_dict()
        rows = dump.get(table, {})
        for key in h.tables[table].keys() | rows.keys():
            assert h.tables[table].get(key, empty) == rows.get(key, empty), (table, key)


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
    bad = {**item, "ctx": {**item["ctx"], "post_id": "q"}, "counts": {}, "route": [list(h) for h in item["route"]],
           "to": [["url", item["to"][0][1]], ["ip", "10.0.0.1"]]}  # not a table of this stage
    event = Event()
    stage.apply(good, event)
    with pytest.raises(Exception):  # noqa: B017 - whatever breaks, the url state must come back
        stage.apply(bad, event)
    stage.flush()
    url_state = load_state("url", tables["url"][item["to"][0][1]])
    assert url_state.posts.count == 1  # p counted, q (failed half-way) not
    assert RESENT in good["ctx"] and RESENT not in bad["ctx"]  # tried again, q's first table decides afresh


def test_a_post_held_back_behind_more_posts_than_the_id_window_still_counts_once():
    """Two users post from one ip; the ip-stage hop of u1's post stands still while u2's posts (more than
    the tables remember ids of) go through, then arrives. The ip table counts it, as modpipe.features.offline does,
    and a re-send of it, which the user table tells apart, is counted nowhere."""
    limits = Limits(dedup_ids=4)

    def post(pid: str, user: str, minute: int) -> dict:
        return {"post_id": pid, "user_id": user, "ip": "10.0.0.9", "url": "http://a.com/x", "text": pid,
                "created_at": f"2026-01-01T00:{minute:02d}:00Z"}

    events = [("post", post("late", "u1", 0)), *(("post", post(f"p{i}", "u2", i + 1)) for i in range(10))]
    h = Harness(limits=limits)
    h.hold = lambda stage, item: stage == "ip" and item["ctx"]["post_id"] == "late"
    for kind, raw in events:
        h.send(kind, raw)
    assert len(h.held) == 1 and "late" not in h.features
    h.hold = lambda stage, item: False
    h.queue.extend(h.held)
    h.settle()
    h.send("post", post("late", "u1", 0))  # sent again upstream

    offline = compute(events, limits=limits)
    assert h.features["p9"]["ip_posts"] == offline.features["p9"]["ip_posts"] - 1 == 10  # before `late` came
    for table, key in ((fe.IP, "10.0.0.9"), (fe.USER, "u1"), (fe.USER, "u2"), (fe.DOMAIN, "a.com")):
        streaming = load_state(table, h.tables[table][key])
        assert streaming.posts.count == offline.store.get(table, key).posts.count, (table, key)
    assert load_state(fe.IP, h.tables[fe.IP]["10.0.0.9"]).posts.count == 11


def test_a_rebuild_redoes_a_post_as_its_first_table_saw_it():
    """An item fails after an earlier post of the same batch went through the user table: the rebuild redoes
    that post without the re-send mark it took afterwards, so the user table still knows its id."""
    tables = {t: {} for t in fe.TABLES}
    stage = Stage("user", tables, DEFAULT_LIMITS, is_banned=lambda key: False)
    raw = {"post_id": "p", "user_id": "u", "ip": "10.0.0.1", "text": "x", "created_at": "2026-01-01T00:00:00Z"}
    event = Event()
    _, _, first = post_item(raw, 0)
    stage.apply(first, event)
    _, _, other = post_item({**raw, "post_id": "q"}, 0)
    with pytest.raises(Exception):  # noqa: B017 - the ip table is not on this stage
        stage.apply({**other, "to": [["user", "u"], ["ip", "10.0.0.1"]]}, event)
    _, _, again = post_item(raw, 0)  # p sent again upstream, in the same batch
    stage.apply(again, event)
    stage.flush()
    assert again["ctx"][RESENT] is True
    assert load_state(fe.USER, tables[fe.USER]["u"]).posts.count == 1


@pytest.mark.parametrize("user", ["busy", None], ids=["account", "link-without-account"])
def test_posts_dated_before_a_busy_accounts_first_are_each_decided_once(user):
    """300 posts of one account, then posts dated hours, days and a year before its first (below every id its
    first table keeps): each is decided once, and a re-send of any post is not decided again; every table equals
    modpipe.features.offline's."""
    events, again = backdated_events(user)

    def decide(post, features):
        return post["post_id"].startswith("back-")

    h = Harness(decide=decide)
    for kind, raw in events:
        h.send(kind, raw)
    posts = {raw["post_id"] for _, raw in events}
    assert h.decided == dict.fromkeys(posts, 1)
    assert h.resent == len(again)
    offline = compute(events, decide=decide)
    assert h.features == offline.features
    dump = offline.store.dump()
    for table in (fe.USER, fe.URL, fe.DOMAIN, fe.IP):
        assert h.tables[table] == dump.get(table, {}), table
    # the post table also holds each decision's snapshot here, which offline decisions do not carry
    assert {k: {**v, "snapshot": None} for k, v in h.tables[fe.POST].items()} == dump[fe.POST]
    assert load_state(fe.IP, h.tables[fe.IP]["192.0.2.7"]).posts.count == len(posts)
    # the posts dated below the ids of their first table asked the post table: the four backdated ones and the one
    # between two evicted posts, then the re-sends of those and of the first post (evicted by then)
    assert h.checked == 5 + 6


def test_a_backdated_post_and_its_resend_in_flight_together_are_decided_once():
    """Both copies are below the user's ids when they reach the user table, one right behind the other: the post
    table claims the id for the first, so the second is a re-send."""
    events, _ = backdated_events("busy", n=300)
    h = Harness()
    for kind, raw in events[:300]:
        h.send(kind, raw)
    old = events[300][1]
    assert old["post_id"] == "back-1h"
    h.queue.extend([post_item(old, 0), post_item(dict(old), 0)])
    h.settle()
    assert h.decided["back-1h"] == 1 and h.resent == 1
    user = load_state(fe.USER, h.tables[fe.USER]["busy"])
    assert user.posts.count == 301 and user.texts.get(fe.prepare_post(old)["text_fp"]) == 1
    assert load_state(fe.POST, h.tables[fe.POST]["back-1h"]).info is not None


def test_a_resend_asking_the_post_table_stays_behind_its_original():
    """The ip partition stands still while an account posts past the ids its user table keeps, and then sends its
    first post again: the re-send is below the ids, so it asks the post table, along the post's own route. It
    reaches the post table behind the original (the held partition keeps its order), which the post table knows
    by then: the re-send counts nowhere and is not decided."""
    limits = Limits(dedup_ids=4)

    def post(i: int) -> dict:
        return {"post_id": f"p{i}", "user_id": "u", "ip": "10.0.0.9", "url": "http://a.com/x", "text": f"t{i}",
                "created_at": f"2026-01-01T00:{i:02d}:00Z"}

    events = [("post", post(i)) for i in range(6)] + [("post", post(0))]
    h = Harness(limits=limits)
    h.hold = lambda stage, item: stage == "ip"  # everything that reaches the ip partition waits, in order
    for kind, raw in events:
        h.send(kind, raw)
    assert h.checked == 1 and not h.decided
    h.hold = lambda stage, item: False
    h.queue.extend(h.held)
    h.settle()
    assert h.decided == {f"p{i}": 1 for i in range(6)} and h.resent == 1
    offline = compute(events, limits=limits)
    for table, key in ((fe.USER, "u"), (fe.URL, "a.com/x"), (fe.DOMAIN, "a.com"), (fe.IP, "10.0.0.9")):
        assert load_state(table, h.tables[table][key]).posts.count == 6, table
        assert h.tables[table][key] == offline.store.dump()[table][key], table
