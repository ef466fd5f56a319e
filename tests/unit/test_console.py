"""The review console without Kafka: the index (queue order, revisions, labels, bounds) and the HTTP API
(login, token, escaping headers, label validation) over a real HTTP server with a recording label sink."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from console.index import DecisionIndex
from console.server import ConsoleError, serve


class Clock:
    def __init__(self, t=1_000.0):
        self.t = t

    def __call__(self):
        return self.t


def decision(pid, verdict="review", revision=1, user="u1", decided_at="2026-11-23T10:00:00.000Z", **extra):
    return {"post_id": pid, "user_id": user, "verdict": verdict, "revision": revision, "spam_probability": 0.5,
            "text_probability": 0.4, "reasons": [{"text": "because"}], "features": {"user_posts": 1},
            "decided_at": decided_at, "latency_ms": 12, **extra}


def test_queue_is_review_posts_without_a_label_oldest_first():
    index = DecisionIndex(clock=Clock())
    index.add_decision(decision("b", decided_at="2026-11-23T10:00:02.000Z"))
    index.add_decision(decision("a", decided_at="2026-11-23T10:00:01.000Z"))
    index.add_decision(decision("c", verdict="allow"))
    index.add_decision(decision("d", verdict="block", user="u2"))
    index.add_post({"post_id": "a", "user_id": "u1", "text": "<b>hi</b>", "url": "http://x.test/"})
    q = index.queue()
    assert q["size"] == 2 and [p["post_id"] for p in q["posts"]] == ["a", "b"]
    assert q["posts"][0]["text"] == "<b>hi</b>" and q["posts"][0]["url"] == "http://x.test/"
    index.add_label({"post_id": "a", "user_id": "u1", "label": "spam", "moderator_id": "m1",
                     "created_at": "2026-11-23T10:01:00.000Z"})
    assert [p["post_id"] for p in index.queue()["posts"]] == ["b"]
    assert [p["post_id"] for p in index.blocks()] == ["d"]
    assert index.post("a")["label"] == "spam" and index.post("a")["labelled_by"] == "m1"


def test_a_later_revision_moves_a_post_and_a_repeated_revision_replaces_the_earlier_copy():
    index = DecisionIndex(clock=Clock())
    index.add_decision(decision("a"))
    index.add_decision(decision("a", verdict="block", revision=2))
    assert index.queue()["size"] == 0 and index.blocks()[0]["revision"] == 2
    index.add_decision(decision("b", verdict="review"))
    index.add_decision(decision("b", verdict="allow"))  # a replayed revision 1: the last copy stands
    detail = index.post("b")
    assert detail["verdict"] == "allow" and [r["verdict"] for r in detail["revisions"]] == ["allow"]


def test_user_search_stats_and_the_memory_bound():
    clock = Clock()
    index = DecisionIndex(max_posts=3, clock=clock)
    for i in range(5):
        index.add_decision(decision(f"p{i}", verdict="block" if i % 2 else "allow", user="u1"))
    assert index.stats()["posts_known"] == 3
    user = index.user("u1")
    assert [p["post_id"] for p in user["posts"]] == ["p4", "p3", "p2"] and user["verdicts"] == {"allow": 2, "block": 1}
    assert index.search("p4")["post"]["post_id"] == "p4" and index.search("u1")["user"]["user_id"] == "u1"
    assert index.search("nobody") == {"post": None, "user": None}
    series = index.stats(window_s=10)["series"]
    assert len(series) == 10 and sum(b["allow"] + b["block"] for b in series) == 5 and series[-1]["p50_ms"] == 12


@pytest.fixture
def console():
    index = DecisionIndex(clock=Clock())
    published = []

    def publish(label):
        published.append(label)
        return {**label, "created_at": "now"}

    index.add_decision(decision("p1"))
    index.add_post({"post_id": "p1", "user_id": "u1", "text": "<script>alert(1)</script>"})
    servers = []

    def start(token=""):
        server = serve(index, publish, host="127.0.0.1", port=0, token=token, default_moderator="local")
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", published

    yield start
    for server in servers:
        server.shutdown()


def call(url, data=None, headers=None, cookie=None):
    headers = dict(headers or {})
    if cookie:
        headers["Cookie"] = cookie
    request = urllib.request.Request(url, data=json.dumps(data).encode() if data is not None else None,
                                     headers=headers, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


LABEL_HEADERS = {"Content-Type": "application/json", "X-Requested-With": "modpipe-console"}


def test_api_serves_json_and_the_page_with_a_strict_policy(console):
    base, _ = console()
    status, headers, body = call(base + "/api/queue")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["posts"][0]["text"] == "<script>alert(1)</script>"  # data, escaped by JSON
    status, headers, body = call(base + "/")
    assert status == 200 and b"console.js" in body and "script-src 'self'" in headers["Content-Security-Policy"]
    script = call(base + "/console.js")[2].decode()
    assert not re.search(r"innerHTML\s*=|outerHTML\s*=|insertAdjacentHTML|document\.write", script)  # text only
    assert call(base + "/api/post/nope")[0] == 404


def test_label_is_validated_and_carries_the_session_moderator(console):
    base, published = console()
    assert call(base + "/api/label", {"post_id": "p1", "label": "spam"})[0] == 403  # no X-Requested-With
    assert call(base + "/api/label", {"post_id": "p1", "label": "maybe"}, LABEL_HEADERS)[0] == 400
    assert call(base + "/api/label", {"post_id": "zz", "label": "spam"}, LABEL_HEADERS)[0] == 404
    status, _, body = call(base + "/api/label", {"post_id": "p1", "label": "ham"}, LABEL_HEADERS)
    assert status == 200 and published == [{"post_id": "p1", "user_id": "u1", "label": "ham", "moderator_id": "local"}]


def test_with_a_token_nothing_without_login_and_the_login_names_the_moderator(console):
    base, published = console(token="s3cret")
    assert call(base + "/api/queue")[0] == 401 and call(base + "/")[0] == 401
    assert call(base + "/login?token=wrong&moderator=ann")[0] == 403

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as exc:
        opener.open(base + "/login?token=s3cret&moderator=ann", timeout=5)
    assert exc.value.code == 303
    cookie = exc.value.headers["Set-Cookie"].split(";")[0]
    assert "HttpOnly" in exc.value.headers["Set-Cookie"]
    assert call(base + "/api/me", cookie=cookie)[2] == b'{"moderator": "ann"}'
    assert call(base + "/api/label", {"post_id": "p1", "label": "spam"}, LABEL_HEADERS, cookie)[0] == 200
    assert published[-1]["moderator_id"] == "ann"
    assert call(base + "/login?token=s3cret&moderator=" + "<x>")[0] == 400


def test_a_public_bind_without_a_token_is_refused():
    with pytest.raises(ConsoleError):
        serve(DecisionIndex(), lambda label: label, host="0.0.0.0", port=0)
