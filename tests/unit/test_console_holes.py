"""The holes of issue #62, each over a real uvicorn-served console on 127.0.0.1 (or the real index): a demoted
proxy moderator, a doubled identity header, throttling by the forwarded address that nobody elsewhere can turn
against an account's owner, one session per proxy identity made in O(1), escaped log fields, HTTP/1.1
keep-alive, a per-request deadline, and an index bounded in bytes with lists clamped to the page."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time

import argon2
import pytest
from modpipe.console.audit import AuditLog
from modpipe.console.auth import Accounts, LoginThrottle, ProxyIdentity, Sessions
from modpipe.console.index import LIST_TEXT, MAX_LIST, DecisionIndex
from modpipe.console.server import ConsoleConfig, serve

from modpipe.log import JsonFormatter, TextFormatter
from tests.unit.test_console import Clock, Console, decision

PASSWORD = "correct horse battery"
# cheap argon2 parameters: these tests change roles and passwords, the hashing cost is tested elsewhere
FAST_HASHER = argon2.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1)


@pytest.fixture
def start(tmp_path):
    servers = []

    def start(proxy=None, **config):
        accounts = Accounts(tmp_path / "accounts.json", FAST_HASHER)
        if not accounts.list():
            accounts.add("ann", PASSWORD, "moderator")
        index = DecisionIndex(clock=Clock())
        index.add_decision(decision("p1"))
        published = []
        server = serve(index, lambda label: published.append(label) or label,
                       config=ConsoleConfig(**{"host": "127.0.0.1", "port": 0, **config}), accounts=accounts,
                       audit=AuditLog(tmp_path / f"audit-{len(servers)}.jsonl"), proxy=proxy,
                       throttle=LoginThrottle(clock=Clock()))
        servers.append(server)
        return Console(server, published, None, None, tmp_path / f"audit-{len(servers) - 1}.jsonl", accounts)

    yield start
    for server in servers:
        server.shutdown()


def proxied(c: Console, user: str, cookie=None) -> tuple[int, dict, str]:
    status, headers, body = c.call("/api/me", headers={"X-Forwarded-User": user}, cookie=cookie)
    return status, json.loads(body), (headers["Set-Cookie"] or "").split(";")[0] if headers["Set-Cookie"] else cookie


def test_a_proxy_moderator_demoted_or_removed_loses_the_role_at_the_next_request(start):
    c = start(proxy=ProxyIdentity("X-Forwarded-User", "127.0.0.1/32", role="viewer"))
    status, me, cookie = proxied(c, "ann")
    assert status == 200 and me["role"] == "moderator"
    assert c.label(cookie, me["csrf"], headers={"X-Forwarded-User": "ann"})[0] == 200
    c.accounts.add("ann", PASSWORD, "viewer")  # demoted while the session lives
    assert proxied(c, "ann", cookie)[1]["role"] == "viewer"
    status, _, body = c.label(cookie, me["csrf"], headers={"X-Forwarded-User": "ann"})
    assert status == 403 and b"only a moderator labels" in body
    c.accounts.add("ann", PASSWORD, "moderator")
    assert c.label(cookie, me["csrf"], headers={"X-Forwarded-User": "ann"})[0] == 200
    c.accounts.remove("ann")  # removed: what the proxy alone gives (viewer here)
    assert proxied(c, "ann", cookie)[1]["role"] == "viewer"
    assert c.label(cookie, me["csrf"], headers={"X-Forwarded-User": "ann"})[0] == 403
    assert [p["moderator_id"] for p in c.published] == ["ann", "ann"]


def test_the_identity_header_sent_twice_is_refused(start):
    c = start(proxy=ProxyIdentity("X-Forwarded-User", "127.0.0.1/32", role="moderator"))
    connection = http.client.HTTPConnection("127.0.0.1", c.port, timeout=5)
    try:
        connection.putrequest("GET", "/api/me", skip_host=True)
        connection.putheader("Host", f"127.0.0.1:{c.port}")
        connection.putheader("X-Forwarded-User", "mallory")  # what the client sent, kept by an appending proxy
        connection.putheader("x-forwarded-user", "ann")  # what the proxy added
        connection.endheaders()
        response = connection.getresponse()
        body = response.read()
        assert response.status == 400 and b"more than once" in body and not response.getheader("Set-Cookie")
    finally:
        connection.close()
    assert proxied(c, "ann")[1]["moderator"] == "ann"  # once is fine


def test_sign_in_throttling_counts_the_forwarded_client_and_nobody_elsewhere_locks_the_owner_out(start):
    # A TLS-terminating proxy on 127.0.0.1 forwards the client's address: every moderator arrives from it.
    c = start(proxy=ProxyIdentity("", "127.0.0.1/32"))

    def login(password, forwarded, name="ann"):
        return c.call("/api/login", {"name": name, "password": password},
                      headers={"X-Forwarded-For": forwarded})[0]

    attacker, owner = "203.0.113.9", "198.51.100.7"
    assert [login("wrong password", attacker) for _ in range(4)] == [401, 401, 401, 429]
    assert login(PASSWORD, f"{owner}, {attacker}") == 429  # a made-up hop before the proxy's own is not believed
    assert login("wrong password", attacker, name="bob") == 429  # the attacker's address, whatever the name
    assert login(PASSWORD, owner) == 200  # the owner, elsewhere, is not held up
    for _ in range(3):  # the owner's own mistakes slow the owner down (and only them)
        assert login("my typo password", owner) == 401
    assert login(PASSWORD, owner) == 429 and login(PASSWORD, "198.51.100.8") == 200


def test_the_forwarded_address_is_believed_from_the_proxy_only():
    proxy = ProxyIdentity("", "10.0.0.0/8")

    class H(dict):
        def get_all(self, name):
            return [v for k, v in self.items() if k.lower() == name.lower()]

    assert proxy.client("192.0.2.1", H({"X-Forwarded-For": "198.51.100.7"})) == "192.0.2.1"  # not the proxy
    assert proxy.client("10.1.1.1", H({"X-Forwarded-For": "198.51.100.7, 10.2.2.2"})) == "198.51.100.7"
    assert proxy.client("10.1.1.1", H({"X-Forwarded-For": "not-an-address"})) == "10.1.1.1"
    assert proxy.client("10.1.1.1", H({})) == "10.1.1.1"


def test_cookieless_proxy_requests_share_one_session_per_identity(start):
    c = start(proxy=ProxyIdentity("X-Forwarded-User", "127.0.0.1/32"))
    cookies = {proxied(c, "pat")[2] for _ in range(30)}
    assert len(cookies) == 1 and len(c.server.app.sessions) == 1
    proxied(c, "kim")
    assert len(c.server.app.sessions) == 2


def test_making_a_session_does_not_walk_the_live_ones():
    class Counting(Sessions):
        checked = 0

        def _expired(self, s, now):
            Counting.checked += 1
            return super()._expired(s, now)

    clock = Clock(0.0)
    sessions = Counting(idle_s=60, max_s=300, clock=clock)
    for _ in range(2000):
        sessions.create("ann", "moderator", "password")
    Counting.checked = 0
    sessions.create("ann", "moderator", "password")
    assert Counting.checked <= 1
    clock.t = 301  # past max_s: the old ones go, from the front
    sessions.create("ann", "moderator", "password")
    assert len(sessions) == 1


@pytest.mark.parametrize("formatter", [TextFormatter(), JsonFormatter()], ids=["text", "json"])
def test_a_sign_in_name_cannot_forge_a_log_line(start, caplog, formatter):
    c = start()
    forged = "x\n12:00:00 INFO    modpipe.console.server: console sign-in [moderator=root role=moderator]\x1b[2K"
    with caplog.at_level(logging.INFO, logger="modpipe.console.server"):
        assert c.call("/api/login", {"name": forged, "password": "wrong password"})[0] == 401
    failed = [r for r in caplog.records if r.getMessage() == "console sign-in failed"]
    assert failed
    line = formatter.format(failed[0])
    assert "\n" not in line and "\x1b" not in line and "\\n12:00:00" in line.replace("\\\\", "\\")


def test_the_server_keeps_a_connection_alive_and_drops_a_client_that_never_finishes_its_request(start):
    c = start(request_timeout_s=0.5)
    connection = http.client.HTTPConnection("127.0.0.1", c.port, timeout=5)
    try:
        for _ in range(3):  # three requests, one connection (HTTP/1.1 keep-alive)
            connection.request("GET", "/login")
            response = connection.getresponse()
            response.read()
            assert response.status == 200 and response.version == 11
        first = connection.sock
        started = time.monotonic()
        for _ in range(20):  # a reply's head and body leave at once (TCP_NODELAY): no 40 ms delayed-ACK wait each
            connection.request("GET", "/healthz")
            connection.getresponse().read()
        assert connection.sock is first and time.monotonic() - started < 0.4
    finally:
        connection.close()
    with socket.create_connection(("127.0.0.1", c.port), timeout=5) as slow:
        slow.sendall(b"GET /login HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # and never the blank line
        started = time.monotonic()
        assert slow.recv(100) == b""  # closed, unanswered
        assert time.monotonic() - started < 3
    with socket.create_connection(("127.0.0.1", c.port), timeout=5) as kept:  # the same on a kept-alive one
        for _ in range(2):  # idle between requests: uvicorn's keep-alive timeout (15 s), not the request deadline
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answer = b""
            while not answer.endswith(b'{"ok": true}'):
                chunk = kept.recv(1000)
                assert chunk, answer
                answer += chunk
            time.sleep(1)
        kept.sendall(b"GET /login HTTP/1.1\r\n")  # the next request, never finished
        started = time.monotonic()
        assert kept.recv(100) == b"" and time.monotonic() - started < 3


def test_the_index_is_bounded_in_bytes_and_lists_are_clamped_to_the_page():
    index = DecisionIndex(max_posts=100_000, max_bytes=2_000_000, clock=Clock())
    for i in range(1000):
        index.add_post({"post_id": f"p{i}", "user_id": "spammer", "text": "é" * 10_000})
        index.add_decision(decision(f"p{i}", user="spammer"))
    stats = index.stats()
    assert stats["bytes_known"] <= 2_000_000 and 50 < stats["posts_known"] < 100
    assert index.post("p999") is not None and index.post("p0") is None  # the oldest went
    queue = index.queue(limit=10_000)
    assert len(queue["posts"]) == min(MAX_LIST, queue["size"]) and queue["size"] == stats["posts_known"]
    assert all(len(p["text"]) == LIST_TEXT and p["text_truncated"] for p in queue["posts"])
    assert len(index.post("p999")["text"]) == 10_000  # the post's own page has all of it
    user = index.user("spammer", limit=10_000)
    assert user["posts"][0]["post_id"] == "p999" and len(user["posts"]) <= MAX_LIST
    assert user["known_posts"] == stats["posts_known"]


def test_a_prolific_authors_forgotten_posts_leave_their_list():
    index = DecisionIndex(max_posts=50, clock=Clock())
    for i in range(5000):
        index.add_decision(decision(f"p{i}", user="spammer"))
    user = index.user("spammer")
    assert user["known_posts"] == 50 and [p["post_id"] for p in user["posts"][:2]] == ["p4999", "p4998"]
    assert index.queue()["size"] == 50


@pytest.mark.parametrize("seed", range(5))
def test_the_kept_queue_and_blocks_match_a_full_sort_whatever_the_records(seed):
    """The queue and the blocks are kept as records arrive (a heap, stale entries dropped lazily): after any mix
    of decisions, revisions, replays, labels and evictions they equal a sort of every post the index holds."""
    import random

    from tests.unit.test_console import at

    rng = random.Random(seed)
    index = DecisionIndex(max_posts=300, clock=Clock())
    for _ in range(3000):
        pid = f"p{rng.randrange(600)}"
        if rng.random() < 0.1:
            index.add_label({"post_id": pid, "label": "spam", "created_at": at(rng.randrange(100))})
        else:
            index.add_decision(decision(pid, verdict=rng.choice(["allow", "review", "review", "block"]),
                                        revision=rng.randrange(1, 4), decided_at=at(-rng.randrange(5000))))
    views = list(index._posts.values())
    waiting = sorted((v for v in views if v.waiting), key=lambda v: v.decided_at_s)
    blocked = sorted((v for v in views if v.blocked), key=lambda v: -v.decided_at_s)
    queue = index.queue(MAX_LIST)
    assert queue["size"] == len(waiting)
    assert [p["waiting_s"] for p in queue["posts"]] == [v.summary(index.clock())["waiting_s"]
                                                        for v in waiting[:MAX_LIST]]
    assert {p["post_id"] for p in queue["posts"]} <= {v.post_id for v in waiting}
    assert [v.decided_at_s for v in (index._posts[p["post_id"]] for p in index.blocks(MAX_LIST))] == \
        [v.decided_at_s for v in blocked[:MAX_LIST]]


def test_health_and_refusals_answer_while_every_handler_thread_is_busy(tmp_path):
    """/healthz and a foreign Host are answered on the event loop: a broker that stalls every label (and so
    every handler thread) does not take the liveness probe down or let refused requests queue behind it."""
    import concurrent.futures
    import threading

    from modpipe.console.server import HANDLER_THREADS

    accounts = Accounts(tmp_path / "accounts.json", FAST_HASHER)
    accounts.add("ann", PASSWORD)
    index = DecisionIndex(clock=Clock())
    index.add_decision(decision("p1"))
    release, stalled = threading.Event(), []

    def stalled_publish(label):
        stalled.append(label)
        release.wait(20)
        return label

    server = serve(index, stalled_publish, config=ConsoleConfig(), accounts=accounts,
                   audit=AuditLog(tmp_path / "audit.jsonl"))
    c = Console(server, [], None, None, None, None)
    try:
        cookie, csrf = c.sign_in()
        with concurrent.futures.ThreadPoolExecutor(HANDLER_THREADS) as pool:
            labels = [pool.submit(c.label, cookie, csrf) for _ in range(HANDLER_THREADS)]
            deadline = time.monotonic() + 10
            while len(stalled) < HANDLER_THREADS and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(stalled) == HANDLER_THREADS  # every handler thread is waiting for the broker
            started = time.monotonic()
            assert c.call("/healthz")[0] == 200
            assert c.call("/api/queue", cookie=cookie, host="evil.test")[0] == 421
            assert time.monotonic() - started < 2
            release.set()
            assert [f.result(timeout=20)[0] for f in labels] == [200] * HANDLER_THREADS
    finally:
        release.set()
        server.shutdown()


def test_one_address_cannot_hold_more_than_its_share_of_connections_but_the_proxy_can(start):
    c = start(max_connections_per_address=5)
    held = [socket.create_connection(("127.0.0.1", c.port), timeout=5) for _ in range(5)]
    try:
        with socket.create_connection(("127.0.0.1", c.port), timeout=5) as sixth:
            assert sixth.recv(100) == b""  # closed at once, before a byte of its request
        held.pop().close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # until the server saw that one go
            connection = http.client.HTTPConnection("127.0.0.1", c.port, timeout=5)
            try:
                connection.request("GET", "/healthz")
                if connection.getresponse().status == 200:
                    break
            except (ConnectionError, http.client.HTTPException):
                time.sleep(0.05)
            finally:
                connection.close()
        else:
            raise AssertionError("no connection after one of the five closed")
    finally:
        for s in held:
            s.close()
    proxied_console = start(max_connections_per_address=5, proxy=ProxyIdentity("", "127.0.0.1/32"))
    many = [socket.create_connection(("127.0.0.1", proxied_console.port), timeout=5) for _ in range(8)]
    try:
        assert proxied_console.call("/healthz")[0] == 200  # the proxy's address is not capped
    finally:
        for s in many:
            s.close()
