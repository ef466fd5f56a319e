"""The review console without Kafka: the index (queue order, revisions, labels, bounds, charts by decision
time) and the HTTP API over a real HTTP server with a recording label sink: Host and Origin checks, sign-in
with argon2id accounts, sessions (expiry, forgery, sign-out), CSRF, roles, throttled sign-ins, the audit
log, a sign-in proxy's header, and no secret in a log line."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from modpipe.console.audit import AuditLog
from modpipe.console.auth import Accounts, LoginThrottle, ProxyIdentity
from modpipe.console.index import DecisionIndex
from modpipe.console.server import ConsoleConfig, ConsoleError, serve

from modpipe.settings import SETTINGS_SPEC


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


T0 = 1_795_435_200.0  # 2026-11-23T12:00:00Z


def at(offset_s: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(T0 + offset_s, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def test_user_search_and_the_memory_bound():
    index = DecisionIndex(max_posts=3, clock=Clock(T0))
    for i in range(5):
        index.add_decision(decision(f"p{i}", verdict="block" if i % 2 else "allow", user="u1", decided_at=at(-1)))
    assert index.stats()["posts_known"] == 3
    user = index.user("u1")
    assert [p["post_id"] for p in user["posts"]] == ["p4", "p3", "p2"] and user["verdicts"] == {"allow": 2, "block": 1}
    assert index.search("p4")["post"]["post_id"] == "p4" and index.search("u1")["user"]["user_id"] == "u1"
    assert index.search("nobody") == {"post": None, "user": None}
    series = index.stats(window_s=10)["series"]
    assert len(series) == 10 and sum(b["allow"] + b["block"] for b in series) == 5 and series[-2]["p50_ms"] == 12


def test_charts_count_decisions_by_when_they_were_decided_not_when_the_console_read_them():
    """A console started late reads 30 s of steady traffic at once: the chart shows 30 s of it, not one spike."""
    clock = Clock(T0)
    index = DecisionIndex(clock=clock)
    for second in range(30):  # decided over the last 30 s, 2 per second, all read now
        for k in range(2):
            index.add_decision(decision(f"p{second}-{k}", verdict="allow", decided_at=at(-30 + second + 0.2),
                                        latency_ms=10 + second))
    index.add_decision(decision("ancient", verdict="block", decided_at=at(-3600)))  # far outside every window
    series = index.stats(window_s=60)["series"]
    counts = [b["allow"] for b in series]
    assert counts[-31:-1] == [2] * 30 and counts[-1] == 0 and sum(counts[:-31]) == 0
    assert [b["p50_ms"] for b in series[-31:-1]] == list(range(10, 40))
    assert sum(b["block"] for b in series) == 0
    clock.t = T0 + 45  # 45 s later the same decisions have moved left in a 60 s window
    assert sum(b["allow"] for b in index.stats(window_s=60)["series"][:15]) == 2 * 14


# -- the HTTP API

PASSWORD = "correct horse battery"
VIEWER_PASSWORD = "viewer horse battery"


@pytest.fixture(scope="module")
def accounts_file(tmp_path_factory):
    """One accounts file for the module: argon2id hashing is slow on purpose."""
    path = tmp_path_factory.mktemp("accounts") / "accounts.json"
    accounts = Accounts(path)
    accounts.add("ann", PASSWORD, "moderator")
    accounts.add("vic", VIEWER_PASSWORD, "viewer")
    return path


class Console:
    def __init__(self, server, published, clock, throttle_clock, audit_path, accounts):
        self.server, self.published, self.clock, self.throttle_clock = server, published, clock, throttle_clock
        self.audit_path, self.accounts = audit_path, accounts
        self.port = server.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.origin = self.base

    def call(self, path, data=None, headers=None, cookie=None, host=None, origin="own", method=None):
        headers = {"Content-Type": "application/json", **(headers or {})}
        if cookie:
            headers["Cookie"] = cookie
        if host:
            headers["Host"] = host
        if data is not None and origin:
            headers["Origin"] = self.origin if origin == "own" else origin
        request = urllib.request.Request(self.base + path, data=json.dumps(data).encode() if data is not None else None,
                                         headers=headers, method=method or ("POST" if data is not None else "GET"))
        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(request, timeout=5) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, exc.read()

    def sign_in(self, name="ann", password=PASSWORD):
        status, headers, body = self.call("/api/login", {"name": name, "password": password})
        assert status == 200, body
        cookie = headers["Set-Cookie"].split(";")[0]
        csrf = json.loads(self.call("/api/me", cookie=cookie)[2])["csrf"]
        return cookie, csrf

    def label(self, cookie, csrf, post_id="p1", label="spam", headers=None, **body):
        headers = {**({"X-CSRF-Token": csrf} if csrf else {}), **(headers or {})}
        return self.call("/api/label", {"post_id": post_id, "label": label, **body}, headers, cookie)

    def audit_lines(self):
        return [json.loads(line) for line in self.audit_path.read_text().splitlines()]


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


@pytest.fixture
def console(tmp_path, accounts_file):
    index = DecisionIndex(clock=Clock())
    index.add_decision(decision("p1"))
    index.add_post({"post_id": "p1", "user_id": "u1", "text": "<script>alert(1)</script>"})
    servers = []

    def start(proxy=None, **config):
        published = []

        def publish(label):
            published.append(label)
            return {**label, "created_at": "2026-11-23T10:01:00.000Z"}

        clock, throttle_clock = Clock(), Clock()
        audit_path = tmp_path / f"audit-{len(servers)}.jsonl"
        accounts = Accounts(accounts_file)
        server = serve(index, publish, config=ConsoleConfig(**{"host": "127.0.0.1", "port": 0, **config}),
                       accounts=accounts, audit=AuditLog(audit_path), proxy=proxy, clock=clock,
                       throttle=LoginThrottle(clock=throttle_clock))
        servers.append(server)
        return Console(server, published, clock, throttle_clock, audit_path, accounts)

    yield start
    for server in servers:
        server.shutdown()


def test_a_request_naming_another_host_is_refused_whatever_it_asks(console):
    c = console()
    cookie, csrf = c.sign_in()
    for host in ("evil.test", f"evil.test:{c.port}", f"127.0.0.1.evil.test:{c.port}", "127.0.0.1:1",
                 f"localhost.:{c.port}"):
        assert c.call("/api/queue", cookie=cookie, host=host)[0] == 421, host
        assert c.call("/login", host=host)[0] == 421, host
        assert c.call("/api/login", {"name": "ann", "password": PASSWORD}, host=host)[0] == 421, host
    for host in (f"localhost:{c.port}", f"127.0.0.1:{c.port}", f"LOCALHOST:{c.port}"):
        assert c.call("/api/queue", cookie=cookie, host=host)[0] == 200, host
    assert c.call("/healthz", host="evil.test")[2] == b'{"ok": true}'  # no data: probes need no name
    with socket.create_connection(("127.0.0.1", c.port), timeout=5) as raw:  # no Host at all (HTTP/1.0)
        raw.sendall(f"GET /api/queue HTTP/1.0\r\nCookie: {cookie}\r\n\r\n".encode())
        assert raw.recv(100).startswith(b"HTTP/1.1 421")  # an HTTP/1.1 server answers 1.0 requests as 1.1


def test_a_configured_public_name_passes_and_nothing_else(console):
    c = console(public_names=("review.example.com",))
    cookie, _ = c.sign_in()
    assert c.call("/api/queue", cookie=cookie, host="review.example.com")[0] == 200
    assert c.call("/api/queue", cookie=cookie, host="review.example.com:443")[0] == 200
    assert c.call("/api/queue", cookie=cookie, host="other.example.com")[0] == 421


def test_signed_out_nothing_but_the_sign_in_page(console):
    c = console()
    status, headers, _ = c.call("/")
    assert status == 303 and headers["Location"] == "/login"
    for path in ("/api/queue", "/api/blocks", "/api/post/p1", "/api/me", "/api/stats", "/api/search?q=u1"):
        status, _, body = c.call(path)
        assert status == 401 and b"<script>" not in body, path
    status, _, body = c.call("/login")
    assert status == 200 and b'id="login"' in body and b"<script>alert" not in body
    assert c.label(None, "x")[0] == 401 and c.published == []


def test_sign_in_sets_a_strict_cookie_and_the_api_serves_the_page_with_a_strict_policy(console):
    c = console()
    status, headers, body = c.call("/api/login", {"name": "ann", "password": PASSWORD})
    assert status == 200 and json.loads(body) == {"moderator": "ann", "role": "moderator"}
    cookie_header = headers["Set-Cookie"]
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= {f.strip() for f in cookie_header.split(";")}
    assert "Secure" not in cookie_header  # plain HTTP on loopback: a Secure cookie would never come back
    cookie = cookie_header.split(";")[0]
    me = json.loads(c.call("/api/me", cookie=cookie)[2])
    assert (me["moderator"], me["role"], me["via"]) == ("ann", "moderator", "password") and len(me["csrf"]) >= 32
    status, headers, body = c.call("/api/queue", cookie=cookie)
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["posts"][0]["text"] == "<script>alert(1)</script>"  # data, escaped by JSON
    status, headers, body = c.call("/", cookie=cookie)
    assert status == 200 and b"console.js" in body and "script-src 'self'" in headers["Content-Security-Policy"]
    for script in ("/console.js", "/login.js"):
        text = c.call(script)[2].decode()
        assert "fetch(" in text and not re.search(r"innerHTML\s*=|outerHTML\s*=|insertAdjacentHTML|document\.write",
                                                  text)  # text only
    assert c.call("/api/post/nope", cookie=cookie)[0] == 404


def test_a_label_carries_the_signed_in_moderator_and_is_audited_once(console):
    c = console()
    cookie, csrf = c.sign_in()
    assert c.label(cookie, csrf, label="maybe")[0] == 400
    assert c.label(cookie, csrf, post_id="zz")[0] == 404
    status, _, body = c.label(cookie, csrf, label="ham", moderator_id="mallory")  # a name the caller makes up
    assert status == 200, body
    assert c.published == [{"post_id": "p1", "user_id": "u1", "label": "ham", "moderator_id": "ann"}]
    assert c.label(cookie, csrf, label="spam")[0] == 200
    lines = c.audit_lines()
    assert len(lines) == 2 == len(c.published)
    first = lines[0]
    assert (first["moderator"], first["via"], first["post_id"], first["user_id"], first["label"]) == \
        ("ann", "password", "p1", "u1", "ham")
    assert first["verdict_before"] == "review" and first["revision_before"] == 1 and first["at"]
    assert (c.audit_path.stat().st_mode & 0o777) == 0o600


def test_a_write_without_the_csrf_token_or_from_another_origin_is_refused(console):
    c = console()
    cookie, csrf = c.sign_in()
    assert c.label(cookie, None)[0] == 403
    assert c.label(cookie, "forged-" + csrf[7:])[0] == 403
    other, other_csrf = c.sign_in()
    assert c.label(cookie, other_csrf)[0] == 403  # a different sign-in session's token
    for origin in ("http://evil.test", f"http://evil.test:{c.port}", "null", None):
        status, _, _ = c.call("/api/label", {"post_id": "p1", "label": "spam"}, {"X-CSRF-Token": csrf}, cookie,
                              origin=origin)
        assert status == 403, origin
    status, _, _ = c.call("/api/label", {"post_id": "p1", "label": "spam"},
                          {"X-CSRF-Token": csrf, "Sec-Fetch-Site": "cross-site"}, cookie)
    assert status == 403
    assert c.call("/api/login", {"name": "ann", "password": PASSWORD}, origin="http://evil.test")[0] == 403
    assert c.published == [] and not c.audit_path.read_text()
    assert c.label(cookie, csrf)[0] == 200 and c.label(other, other_csrf)[0] == 200


def test_expired_forged_and_signed_out_sessions_are_refused(console):
    c = console(session_idle_s=60, session_max_s=300)
    assert c.call("/api/queue", cookie="modpipe_session=" + "A" * 43)[0] == 401  # forged
    cookie, _ = c.sign_in()
    c.clock.t += 59
    assert c.call("/api/queue", cookie=cookie, headers={"X-Console-Refresh": "1"})[0] == 200
    c.clock.t += 2  # 61 s since the last action: the background refresh did not count
    assert c.call("/api/queue", cookie=cookie)[0] == 401
    cookie, _ = c.sign_in()
    for _ in range(6):  # active every 50 s, yet the session ends 300 s after sign-in
        c.clock.t += 50
        assert c.call("/api/queue", cookie=cookie)[0] == 200
    c.clock.t += 1
    assert c.call("/api/queue", cookie=cookie)[0] == 401
    cookie, csrf = c.sign_in()
    status, headers, _ = c.call("/api/logout", {}, {"X-CSRF-Token": csrf}, cookie)
    assert status == 200 and "Max-Age=0" in headers["Set-Cookie"]
    assert c.call("/api/queue", cookie=cookie)[0] == 401 and c.call("/", cookie=cookie)[0] == 303


def test_a_viewer_reads_the_queue_but_cannot_label(console):
    c = console()
    cookie, csrf = c.sign_in("vic", VIEWER_PASSWORD)
    assert json.loads(c.call("/api/queue", cookie=cookie)[2])["size"] == 1
    status, _, body = c.label(cookie, csrf)
    assert status == 403 and b"only a moderator labels" in body and c.published == []


def test_wrong_passwords_are_slowed_down_and_a_wrong_name_looks_the_same(console):
    c = console()
    assert c.call("/api/login", {"name": "nobody", "password": PASSWORD})[0] == 401
    c.throttle_clock.t += 1000  # forget that address's failure
    for _ in range(3):
        assert c.call("/api/login", {"name": "ann", "password": "wrong password"})[0] == 401
    status, headers, body = c.call("/api/login", {"name": "ann", "password": PASSWORD})  # right, but too soon
    assert status == 429 and headers["Retry-After"] == "1" and b"try again in 1 s" in body
    c.throttle_clock.t += 1.1
    assert c.call("/api/login", {"name": "ann", "password": "wrong again!"})[0] == 401
    c.throttle_clock.t += 1.1  # the wait doubled: 2 s
    assert c.call("/api/login", {"name": "ann", "password": PASSWORD})[0] == 429
    c.throttle_clock.t += 1.0
    assert c.call("/api/login", {"name": "ann", "password": PASSWORD})[0] == 200
    assert c.call("/api/login", {"name": "ann", "password": PASSWORD})[0] == 200  # a success forgot them


def test_the_throttle_doubles_per_key_and_counts_parallel_attempts():
    clock = Clock(0.0)
    throttle = LoginThrottle(free=2, base_s=1, max_s=8, clock=clock)
    assert [throttle.attempt(["a"]) for _ in range(3)] == [0, 0, 1]  # two free, the third waits
    assert throttle.attempt(["b"]) == 0  # another key is not held up
    waits = []
    for _ in range(5):
        clock.t += throttle.attempt(["a"])
        assert throttle.attempt(["a"]) == 0
        waits.append(throttle.attempt(["a"]))
    assert waits == [2, 4, 8, 8, 8]
    clock.t += 8 + 8.1  # forgotten max_s after the last failure
    assert throttle.attempt(["a"]) == 0 and throttle.attempt(["a"]) == 0 and throttle.attempt(["a"]) == 1


def test_a_removed_account_ends_its_sessions_and_the_file_holds_argon2id_hashes(tmp_path):
    path = tmp_path / "console" / "accounts.json"
    accounts = Accounts(path)
    accounts.add("eve", "a long enough password", "moderator")
    text = path.read_text()
    assert "$argon2id$" in text and "a long enough password" not in text and (path.stat().st_mode & 0o777) == 0o600
    assert accounts.verify("eve", "a long enough password").role == "moderator"
    assert accounts.verify("eve", "a long enough passworD") is None and accounts.verify("bob", "x" * 12) is None
    index = DecisionIndex(clock=Clock())
    server = serve(index, lambda label: label, config=ConsoleConfig(), accounts=Accounts(path),
                   audit=AuditLog(tmp_path / "audit.jsonl"))
    try:
        c = Console(server, [], None, None, None, None)
        cookie, _ = c.sign_in("eve", "a long enough password")
        assert c.call("/api/queue", cookie=cookie)[0] == 200
        accounts.remove("eve")
        assert c.call("/api/queue", cookie=cookie)[0] == 401
    finally:
        server.shutdown()


def test_a_sign_in_proxy_is_believed_from_its_address_only(console):
    c = console(proxy=ProxyIdentity("X-Forwarded-User", "127.0.0.1/32", role="viewer"))
    status, headers, body = c.call("/api/me", headers={"X-Forwarded-User": "pat"})
    me = json.loads(body)
    assert status == 200 and (me["moderator"], me["role"], me["via"]) == ("pat", "viewer", "proxy")
    cookie = headers["Set-Cookie"].split(";")[0]
    assert c.label(cookie, me["csrf"], headers={"X-Forwarded-User": "pat"})[0] == 403  # a viewer
    # an account of the same name gives its role
    status, headers, body = c.call("/api/me", headers={"X-Forwarded-User": "ann"})
    me, cookie = json.loads(body), headers["Set-Cookie"].split(";")[0]
    assert me["role"] == "moderator"
    assert c.label(cookie, me["csrf"], headers={"X-Forwarded-User": "ann"})[0] == 200
    assert c.published[-1]["moderator_id"] == "ann" and c.audit_lines()[-1]["via"] == "proxy"
    # the proxy names someone else on the same cookie: not ann's session any more
    assert json.loads(c.call("/api/me", cookie=cookie, headers={"X-Forwarded-User": "pat"})[2])["moderator"] == "pat"
    assert c.call("/api/me", cookie=cookie)[0] == 401  # and without the header, no proxy session

    untrusted = console(proxy=ProxyIdentity("X-Forwarded-User", "10.0.0.0/8", role="moderator"))
    assert untrusted.call("/api/me", headers={"X-Forwarded-User": "ann"})[0] == 401


def test_no_password_session_id_or_csrf_token_in_a_log_line(console, caplog):
    c = console()
    with caplog.at_level(logging.DEBUG):
        c.call("/api/login", {"name": "ann", "password": "wrong password"})
        cookie, csrf = c.sign_in()
        c.call("/api/search?q=u1", cookie=cookie)
        c.label(cookie, csrf)
    lines = [json.dumps({**vars(r), "msg": r.getMessage()}, default=str) for r in caplog.records]
    assert any("console sign-in failed" in line for line in lines) and any('"/api/label"' in line for line in lines)
    for secret in ("wrong password", PASSWORD, cookie.split("=", 1)[1], csrf, "q=u1"):
        assert not [line for line in lines if secret in line], secret


def test_a_public_bind_needs_tls_or_a_proxy_and_a_wildcard_needs_a_public_name(tmp_path):
    def start(**config):
        return serve(DecisionIndex(), lambda label: label, config=ConsoleConfig(**config),
                     accounts=Accounts(tmp_path / "a.json"), audit=AuditLog(tmp_path / "audit.jsonl"))

    with pytest.raises(ConsoleError, match="without TLS"):
        start(host="0.0.0.0", public_names=("review.example.com",))
    with pytest.raises(ConsoleError, match="MODPIPE_CONSOLE_PUBLIC_NAME"):
        start(host="0.0.0.0", plaintext_behind_proxy=True)
    with pytest.raises(ConsoleError, match="both"):
        start(tls_cert=str(tmp_path / "cert.pem"))
    with pytest.raises(ConsoleError, match="unusable"):
        start(tls_cert=str(tmp_path / "cert.pem"), tls_key=str(tmp_path / "key.pem"))


def test_the_console_doc_points_to_every_console_setting():
    """docs/console.md sends its reader to the generated reference, which lists each console setting."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    assert "(configuration.md)" in (docs / "console.md").read_text()
    reference = (docs / "configuration.md").read_text()
    console_settings = [spec.env for name, spec in SETTINGS_SPEC.items() if name.startswith("console_")]
    assert len(console_settings) >= 15
    assert [env for env in console_settings if f"`{env}`" not in reference] == []


def test_the_accounts_commands_and_a_console_without_accounts(tmp_path):
    env = {**os.environ, "MODPIPE_STATE_DIR": str(tmp_path), "MODPIPE_LOG_FORMAT": "text"}

    def modpipe(*args, stdin=""):
        return subprocess.run([sys.executable, "-m", "modpipe", "console", *args], input=stdin, env=env,
                              capture_output=True, text=True, timeout=60)

    refused = modpipe("--port", "0")
    assert refused.returncode == 2 and "modpipe console add-moderator NAME" in refused.stderr
    assert modpipe("add-moderator", "kim", "--password-stdin", stdin="short\n").returncode == 2
    added = modpipe("add-moderator", "kim", "--role", "viewer", "--password-stdin", stdin="kim's long password\n")
    assert added.returncode == 0, added.stderr
    assert modpipe("list-moderators").stdout == "kim\tviewer\n"
    assert Accounts(tmp_path / "console" / "accounts.json").verify("kim", "kim's long password").role == "viewer"
    assert modpipe("remove-moderator", "kim").returncode == 0 and modpipe("list-moderators").stdout == ""
    assert modpipe("remove-moderator", "kim").returncode == 2


def test_at_most_four_password_verifications_run_at_once(tmp_path, accounts_file):
    class Counting(Accounts):
        running = peak = 0
        lock = threading.Lock()

        def verify(self, name, password):
            with self.lock:
                Counting.running += 1
                Counting.peak = max(Counting.peak, Counting.running)
            try:
                time.sleep(0.2)
                return super().verify(name, password)
            finally:
                with self.lock:
                    Counting.running -= 1

    server = serve(DecisionIndex(), lambda label: label, config=ConsoleConfig(), accounts=Counting(accounts_file),
                   audit=AuditLog(tmp_path / "audit.jsonl"), throttle=LoginThrottle(free=100))
    try:
        c = Console(server, [], None, None, None, None)
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            statuses = list(pool.map(lambda _: c.call("/api/login", {"name": "ann", "password": PASSWORD})[0],
                                     range(10)))
        assert statuses == [200] * 10 and Counting.peak == 4
    finally:
        server.shutdown()
