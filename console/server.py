"""The console's HTTP side: a sign-in page and one page (static HTML + JS, no build step) over a JSON API.

    GET  /login                 sign-in page        POST /api/login       {"name", "password"} -> session cookie
    GET  /                      the console         POST /api/logout      ends the session
    GET  /api/me                who, role, CSRF     GET  /api/queue       review queue, oldest first
    GET  /api/blocks            recent blocks       GET  /api/post/<id>   one post with features and revisions
    GET  /api/user/<id>         a user's posts      GET  /api/search?q=   post_id or user_id
    GET  /api/stats             chart data          POST /api/label       {"post_id", "label": spam|ham}
    GET  /healthz               liveness (no data)

Every request names an allowed Host (console/auth.py HostPolicy): a page that rebinds its own name to the
console's address is refused. Every write comes from an allowed Origin and carries the session's CSRF token
in X-CSRF-Token. Everything but the sign-in page and its assets needs a session: signed in with a password
(accounts from `modpipe console add-moderator`) or named by an authenticating reverse proxy. Viewers read;
moderators also label, under their own name, and each label is appended to the audit log.

Post texts are hostile input: the API returns them as JSON and the page puts them into the DOM as text
only (textContent, never innerHTML); a Content-Security-Policy allows no inline script and nothing from
elsewhere. No secret travels in a URL, and the request log has paths without their query.

Served by uvicorn (ASGI, HTTP/1.1 keep-alive, h11) on one event loop: a connection costs a socket, not a
thread; the handlers run in a bounded thread pool. A request's head and body must arrive within
MODPIPE_CONSOLE_REQUEST_TIMEOUT_S of its first byte (or of the connection), so slow clients are dropped
instead of kept, and at most MODPIPE_CONSOLE_MAX_CONNECTIONS connections are held (beyond: 503).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import h11
import uvicorn
from modpipe.console.audit import AuditLog
from modpipe.console.auth import (
    AccountError,
    Accounts,
    HostPolicy,
    LoginThrottle,
    ProxyIdentity,
    Session,
    Sessions,
    csrf_matches,
    is_loopback,
    valid_name,
)
from modpipe.console.index import DecisionIndex
from uvicorn.protocols.http.h11_impl import H11Protocol

from modpipe import log, schema

_log = log.get(__name__)

STATIC = Path(__file__).parent / "static"
PUBLIC_PAGES = {"/login": ("login.html", "text/html; charset=utf-8"), "/login.js": ("login.js", "text/javascript"),
                "/console.css": ("console.css", "text/css"), "/console.js": ("console.js", "text/javascript")}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
MAX_BODY = 10_000
MAX_VERIFYING = 4  # password verifications at once
HANDLER_THREADS = 16  # requests answered at once (argon2 waits in MAX_VERIFYING; the rest are index reads)
REFRESH_HEADER = "X-Console-Refresh"  # the page's background polling: not a moderator's action


class ConsoleError(ValueError):
    """A configuration the console refuses to start with."""


@dataclasses.dataclass(frozen=True)
class ConsoleConfig:
    host: str = "127.0.0.1"
    port: int = 0
    public_names: tuple[str, ...] = ()
    tls_cert: str = ""
    tls_key: str = ""
    plaintext_behind_proxy: bool = False  # a TLS-terminating proxy in front
    session_idle_s: float = 1800.0
    session_max_s: float = 43200.0
    max_connections: int = 1000
    max_connections_per_address: int = 256  # 0: no cap (the proxies of ProxyIdentity are never capped)
    request_timeout_s: float = 10.0
    keep_alive_s: float = 15.0  # longer than the page's 2 s refresh: the polls reuse one connection

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert)

    @property
    def secure_cookies(self) -> bool:
        """The browser speaks HTTPS: to us, or to the proxy in front."""
        return self.tls or self.plaintext_behind_proxy

    @property
    def cookie_name(self) -> str:
        # __Host-: the browser accepts it only Secure, for this host and Path=/ (no sibling domain can set it)
        return "__Host-modpipe_session" if self.secure_cookies else "modpipe_session"

    def check(self) -> None:
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConsoleError("TLS needs both MODPIPE_CONSOLE_TLS_CERT and MODPIPE_CONSOLE_TLS_KEY")
        if not is_loopback(self.host) and not self.tls and not self.plaintext_behind_proxy:
            raise ConsoleError(f"binding {self.host} (not loopback) without TLS would send passwords and session "
                               "cookies in the clear: set MODPIPE_CONSOLE_TLS_CERT and MODPIPE_CONSOLE_TLS_KEY, or "
                               "MODPIPE_CONSOLE_PLAINTEXT_BEHIND_PROXY=on when a TLS-terminating proxy is in front")
        if self.host in ("0.0.0.0", "::", "") and not self.public_names:
            raise ConsoleError(f"binding every address ({self.host or 'empty'}) leaves no name to check requests "
                               "against: set MODPIPE_CONSOLE_PUBLIC_NAME to the name browsers use")


def public_names(setting: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in setting.split(",") if n.strip())


class Headers:
    """A request's headers, names case-insensitive; `get` gives the first value, `get_all` every one."""

    def __init__(self, pairs: list[tuple[bytes, bytes]]):
        self._values: dict[str, list[str]] = {}
        for name, value in pairs:
            self._values.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._values.get(name.lower())
        return values[0] if values else default

    def get_all(self, name: str) -> list[str]:
        return self._values.get(name.lower(), [])


def printable(text: object, limit: int = 64) -> str:
    """A client-supplied string as a log field: control characters escaped, so no format (text or JSON) shows
    a forged line, and cut to `limit`."""
    text = str(text)[:limit]
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


@dataclasses.dataclass
class Reply:
    status: int
    body: object  # bytes are sent as they are, anything else as JSON
    content_type: str = "application/json"
    headers: dict = dataclasses.field(default_factory=dict)


class ConsoleApp:
    """What a request gets, given its method, path, headers and client address (the handler only does I/O)."""

    def __init__(self, index: DecisionIndex, publish_label: Callable[[dict], dict], *, config: ConsoleConfig,
                 policy: HostPolicy, accounts: Accounts, audit: AuditLog, proxy: ProxyIdentity,
                 clock: Callable[[], float] = time.time, throttle: LoginThrottle | None = None):
        self.index, self.publish_label, self.config, self.policy = index, publish_label, config, policy
        self.accounts, self.audit, self.proxy = accounts, audit, proxy
        self.sessions = Sessions(config.session_idle_s, config.session_max_s, clock)
        self.throttle = throttle or LoginThrottle()
        # Each argon2 verification takes 64 MiB and ~0.2 s of a core: a flood of sign-ins from many addresses
        # waits here instead of taking the memory.
        self._verifying = threading.BoundedSemaphore(MAX_VERIFYING)
        self._warned_untrusted_proxy = False

    # -- sessions and cookies
    def _cookie_value(self, headers) -> str | None:
        for part in (headers.get("Cookie") or "").split(";"):
            k, _, v = part.strip().partition("=")
            if k == self.config.cookie_name:
                return v
        return None

    def set_cookie(self, session: Session | None) -> dict:
        flags = "; Path=/; HttpOnly; SameSite=Strict" + ("; Secure" if self.config.secure_cookies else "")
        if session is None:
            return {"Set-Cookie": f"{self.config.cookie_name}=; Max-Age=0{flags}"}
        return {"Set-Cookie": f"{self.config.cookie_name}={session.sid}; Max-Age={int(self.config.session_max_s)}"
                              f"{flags}"}

    def session(self, address: str, headers) -> tuple[Session | None, dict]:
        """The request's session (and the cookie header to send when a proxy's user got a new one)."""
        active = headers.get(REFRESH_HEADER) != "1"
        session = self.sessions.get(self._cookie_value(headers), active=active)
        proxy_user = self.proxy.user(address, headers)
        if self.proxy and proxy_user is None and headers.get(self.proxy.header) and not self._warned_untrusted_proxy:
            self._warned_untrusted_proxy = True  # once: a misconfigured proxy would fill the log
            _log.warning("proxy user header ignored: not from MODPIPE_CONSOLE_PROXY_ADDRESSES",
                         extra={"client": address, "header": self.proxy.header})
        if proxy_user is not None and valid_name(proxy_user):
            # the account is read on every request: a demoted or removed moderator loses the role at once
            account = self.accounts.get(proxy_user)
            role = account.role if account else self.proxy.role
            if session is not None and session.via == "proxy" and session.user == proxy_user:
                session.role = role
                return session, {}
            # one session per user the proxy names: a flood of cookieless requests does not make one each
            session, new = self.sessions.for_proxy_user(proxy_user, role)
            session.role = role
            if new:
                _log.info("console sign-in", extra={"moderator": proxy_user, "role": role, "via": "proxy"})
            return session, self.set_cookie(session)
        if session is None:
            return None, {}
        if session.via == "proxy":  # only while the proxy keeps naming the same user
            self.sessions.drop(session.sid)
            return None, {}
        account = self.accounts.get(session.user)
        if account is None:  # removed since sign-in
            self.sessions.drop(session.sid)
            return None, {}
        session.role = account.role
        return session, {}

    # -- requests
    def handle(self, method: str, path: str, headers, address: str, body: bytes | None) -> Reply:
        return self.gate(method, path, headers) or self.answer(method, path, headers, address, body)

    def gate(self, method: str, path: str, headers) -> Reply | None:
        """The checks before anything else (health, identity header once, Host, Origin): the refusal, or None.
        No I/O and no lock, so the server runs them on its event loop: a refused request never reads its
        body or takes a handler thread."""
        if urllib.parse.urlsplit(path).path == "/healthz":
            return Reply(200, {"ok": True})
        if self.proxy and len(headers.get_all(self.proxy.header)) > 1:
            # a proxy that appends instead of replacing would let the client's own copy come first
            return Reply(400, {"error": f"{self.proxy.header} more than once"})
        if not self.policy.allows_host(headers.get("Host")):
            return Reply(421, {"error": "this console is not reached by that name (Host); see "
                                        "MODPIPE_CONSOLE_PUBLIC_NAME"})
        if method == "POST" and not self._same_origin(headers):
            return Reply(403, {"error": "writes must come from the console's own page (Origin)"})
        return None

    def answer(self, method: str, path: str, headers, address: str, body: bytes | None) -> Reply:
        """A request that passed `gate`."""
        url = urllib.parse.urlsplit(path)
        if method == "GET" and url.path in PUBLIC_PAGES:
            name, content_type = PUBLIC_PAGES[url.path]
            return Reply(200, (STATIC / name).read_bytes(), content_type)
        if method == "POST" and url.path == "/api/login":
            return self._login(headers, address, body)
        try:
            session, cookie = self.session(address, headers)
        except AccountError as exc:
            _log.error("accounts file unreadable", extra={"error": str(exc)})
            return Reply(500, {"error": "the console's accounts file is unreadable"})
        reply = self._signed_in(method, url, headers, body, session) if session else self._signed_out(url)
        reply.headers.update(cookie)
        return reply

    def _same_origin(self, headers) -> bool:
        fetch_site = headers.get("Sec-Fetch-Site")
        return self.policy.allows_origin(headers.get("Origin")) and fetch_site in (None, "same-origin")

    @staticmethod
    def _signed_out(url) -> Reply:
        if url.path.startswith("/api/"):
            return Reply(401, {"error": "sign in first"})
        return Reply(303, b"", "text/plain", {"Location": "/login"})

    def _signed_in(self, method: str, url, headers, body: bytes | None, session: Session) -> Reply:
        query = urllib.parse.parse_qs(url.query)
        if method == "POST":
            if not csrf_matches(session, headers.get("X-CSRF-Token")):
                return Reply(403, {"error": "missing or wrong X-CSRF-Token (GET /api/me gives it)"})
            if url.path == "/api/logout":
                self.sessions.drop(session.sid)
                return Reply(200, {"ok": True}, headers=self.set_cookie(None))
            if url.path == "/api/label":
                return self._label(session, body, headers)
            return Reply(404, {"error": "not found"})
        if url.path == "/":
            return Reply(200, (STATIC / "console.html").read_bytes(), "text/html; charset=utf-8")
        if url.path == "/api/me":
            return Reply(200, {"moderator": session.user, "role": session.role, "via": session.via,
                               "csrf": session.csrf})
        if url.path == "/api/queue":
            return Reply(200, self.index.queue(_int(query, "limit", 100)))
        if url.path == "/api/blocks":
            return Reply(200, {"posts": self.index.blocks(_int(query, "limit", 50))})
        if url.path == "/api/stats":
            return Reply(200, self.index.stats(_int(query, "window", 120)))
        if url.path == "/api/search":
            return Reply(200, self.index.search((query.get("q") or [""])[0]))
        for prefix, get in (("/api/post/", self.index.post), ("/api/user/", self.index.user)):
            if url.path.startswith(prefix):
                found = get(urllib.parse.unquote(url.path[len(prefix):]))
                return Reply(200, found) if found is not None else Reply(404, {"error": "not found"})
        return Reply(404, {"error": "not found"})

    def _login(self, headers, address: str, body: bytes | None) -> Reply:
        try:
            given = _json_body(headers, body)
            name, password = str(given["name"]), str(given["password"])
        except (ValueError, KeyError, TypeError) as exc:
            return Reply(400, {"error": f"body must be {{\"name\": ..., \"password\": ...}} ({exc})"})
        # By client address (the one a trusted proxy forwards), and by account from that address only: a guesser
        # elsewhere slows down themselves, never the account's owner.
        client = self.proxy.client(address, headers)
        keys = [f"address:{client}", f"account:{client}:{name.lower()[:64]}"]
        wait = self.throttle.attempt(keys)
        if wait > 0:
            seconds = math.ceil(wait)
            return Reply(429, {"error": f"too many failed sign-ins: try again in {seconds} s"},
                         headers={"Retry-After": str(seconds)})
        if not self._verifying.acquire(timeout=10):
            return Reply(503, {"error": "too many sign-ins at once: try again"}, headers={"Retry-After": "5"})
        try:
            account = self.accounts.verify(name, password) if valid_name(name) else None
        except AccountError as exc:
            _log.error("accounts file unreadable", extra={"error": str(exc)})
            return Reply(500, {"error": "the console's accounts file is unreadable"})
        finally:
            self._verifying.release()
        if account is None:
            _log.warning("console sign-in failed", extra={"account": printable(name), "client": client})
            return Reply(401, {"error": "wrong name or password"})
        self.throttle.succeeded(keys)
        session = self.sessions.create(account.name, account.role, "password")
        _log.info("console sign-in", extra={"moderator": account.name, "role": account.role, "via": "password",
                                            "client": client})
        return Reply(200, {"moderator": account.name, "role": account.role}, headers=self.set_cookie(session))

    def _label(self, session: Session, body: bytes | None, headers) -> Reply:
        if session.role != "moderator":
            return Reply(403, {"error": f"{session.user} is a {session.role}: only a moderator labels"})
        try:
            given = _json_body(headers, body)
            post_id, label = str(given["post_id"]), given["label"]
        except (ValueError, KeyError, TypeError):
            return Reply(400, {"error": "body must be {\"post_id\": ..., \"label\": \"spam\"|\"ham\"}"})
        if label not in ("spam", "ham"):
            return Reply(400, {"error": "label must be spam or ham"})
        post = self.index.post(post_id)
        if post is None or not post.get("user_id"):
            return Reply(404, {"error": f"unknown post {post_id[:80]!r}"})
        try:
            record = self.publish_label({"post_id": post_id, "user_id": post["user_id"], "label": label,
                                         "moderator_id": session.user})
        except Exception as exc:  # noqa: BLE001 - the broker is away: the moderator must know it did not land
            _log.error("label not published", extra={"post_id": printable(post_id, 200), "error": str(exc)[:300]})
            return Reply(503, {"error": f"label not published: {str(exc)[:200]}"})
        entry = {"at": record.get("created_at") or schema.rfc3339(schema.now_ms()), "moderator": session.user,
                 "role": session.role, "via": session.via, "post_id": post_id, "user_id": post["user_id"],
                 "label": label, "verdict_before": post.get("verdict"), "revision_before": post.get("revision"),
                 "label_before": post.get("label"), "labelled_by_before": post.get("labelled_by")}
        try:
            self.audit.append(entry)
        except OSError as exc:  # published but not audited: the log line keeps the audit entry
            # post and user ids come from the platform's records: escaped like every client-made field
            _log.error("label published but not audited",
                       extra={**{k: printable(v, 300) if isinstance(v, str) else v for k, v in entry.items()},
                              "error": str(exc)})
            return Reply(500, {"error": "label published, but the audit log could not be written"})
        return Reply(200, {"ok": True, "label": record})


def _json_body(headers, body: bytes | None) -> dict:
    if not (headers.get("Content-Type") or "").startswith("application/json"):
        raise ValueError("Content-Type must be application/json")
    given = json.loads(body or b"")
    if not isinstance(given, dict):
        raise TypeError("not an object")
    return given


def _int(query: dict, name: str, default: int) -> int:
    try:  # the index clamps each list to what the page shows
        return max(1, min(10_000, int((query.get(name) or [default])[0])))
    except ValueError:
        return default


class ConsoleASGI:
    """The ASGI side: `ConsoleApp.gate` on the event loop; then reads the body (at most MAX_BODY) and answers with
    `ConsoleApp.answer` in a bounded thread pool (argon2, the broker and the index lock block); adds the security
    headers; logs one line."""

    def __init__(self, app: ConsoleApp):
        self.app = app
        self.pool = concurrent.futures.ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="console-handler")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":  # lifespan is off; websockets are not served
            return
        method = scope["method"]
        headers = Headers(scope["headers"])
        path = scope["raw_path"].decode("latin-1") + ("?" + scope["query_string"].decode("latin-1")
                                                      if scope["query_string"] else "")
        address = (scope.get("client") or ("", 0))[0]
        gated = self.app.gate("POST" if method == "POST" else "GET", path, headers)
        if gated is not None:
            reply = gated
        elif method == "POST":
            body = await self._body(headers, receive)
            reply = body if isinstance(body, Reply) else await self._handle("POST", path, headers, address, body)
        elif method in ("GET", "HEAD"):
            reply = await self._handle("GET", path, headers, address, None)
        else:
            reply = Reply(405, {"error": "GET, HEAD or POST"}, headers={"Allow": "GET, HEAD, POST"})
        payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
        out = {"Content-Type": reply.content_type, "Content-Length": str(len(payload)), **SECURITY_HEADERS}
        if self.app.config.tls:
            out["Strict-Transport-Security"] = "max-age=31536000"
        out.update(reply.headers)
        # logged before the answer leaves: whoever reads the log after the reply finds the line
        _log.debug("http", extra={"method": method, "path": printable(urllib.parse.urlsplit(path).path, 200),
                                  "status": str(reply.status), "client": address})
        await send({"type": "http.response.start", "status": reply.status,
                    "headers": [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in out.items()]})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else payload})

    async def _body(self, headers: Headers, receive) -> bytes | Reply:
        try:
            length = int(headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        too_big = Reply(400, {"error": f"a JSON body of at most {MAX_BODY} bytes is required"})
        if not 0 < length <= MAX_BODY:
            return too_big
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return too_big
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > MAX_BODY:
                return too_big
        return b"".join(chunks)

    async def _handle(self, method: str, path: str, headers: Headers, address: str, body: bytes | None) -> Reply:
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, self.app.answer, method, path,
                                                                    headers, address, body)
        except Exception:  # a bug answers 500, not a dropped connection
            _log.exception("console request failed", extra={"method": method,
                                                            "path": printable(urllib.parse.urlsplit(path).path, 200)})
            return Reply(500, {"error": "internal error (see the console's log)"})


class DeadlineH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline per request: its head and body must arrive within
    `request_timeout_s` of the connection, or on a kept-alive one of the request's first byte, else the
    connection is closed. uvicorn itself waits for a request's head for ever once a byte of it came, so a client
    sending a byte every few seconds would hold the connection. (Between requests, uvicorn's keep-alive timeout
    closes an idle connection.)"""

    # set per server by serve()
    request_timeout_s = 10.0
    per_address = 0  # connections one client address may hold (0: any number)
    uncapped: Callable[[str], bool] = staticmethod(lambda address: False)  # the trusted proxies
    by_address: dict[str, int] = {}
    _deadline: asyncio.TimerHandle | None = None
    _counted: str | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._deadline = self.loop.call_later(self.request_timeout_s, self._expire)
        address = (self.client or ("",))[0]
        if self.per_address and not self.uncapped(address):
            # one address cannot take every connection the server holds (MODPIPE_CONSOLE_MAX_CONNECTIONS)
            if self.by_address.get(address, 0) >= self.per_address:
                _log.debug("connection refused: too many from one address", extra={"client": address})
                transport.close()
                return
            self.by_address[address] = self.by_address.get(address, 0) + 1
            self._counted = address

    def data_received(self, data: bytes) -> None:
        if self._deadline is None:  # the first byte of the next request on a kept-alive connection
            self._deadline = self.loop.call_later(self.request_timeout_s, self._expire)
        super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def connection_lost(self, exc) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if self._counted is not None:
            left = self.by_address.pop(self._counted) - 1
            if left:
                self.by_address[self._counted] = left
            self._counted = None
        super().connection_lost(exc)

    def _expire(self) -> None:
        # their_state: IDLE/SEND_BODY while the client still owes its request; DONE once it is in (we answer)
        if not self.transport.is_closing() and self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
            _log.debug("request timed out", extra={"client": (self.client or ("",))[0]})
            self.transport.close()


class ConsoleServer:
    """A running console: uvicorn on its own event loop in a daemon thread."""

    def __init__(self, app: ConsoleApp, server: uvicorn.Server, sock: socket.socket, thread: threading.Thread):
        self.app, self._server, self.socket, self._thread = app, server, sock, thread
        self.server_address = sock.getsockname()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        scheme = "https" if self.app.config.tls else "http"
        return f"{scheme}://{'localhost' if is_loopback(host) else host}:{port}/"

    def shutdown(self) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self.socket.close()
        self._server.config.app.pool.shutdown(wait=False)  # the ConsoleASGI serve() gave uvicorn


def serve(index: DecisionIndex, publish_label: Callable[[dict], dict], *, config: ConsoleConfig,
          accounts: Accounts, audit: AuditLog, proxy: ProxyIdentity | None = None,
          clock: Callable[[], float] = time.time, throttle: LoginThrottle | None = None) -> ConsoleServer:
    """Start serving in a daemon thread; returns the server (`shutdown()` stops it)."""
    config.check()
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so, and without it a reply's head and
    # body in two writes wait 40 ms for the client's delayed ACK
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))  # here, so a port in use fails the start with OSError
    except OSError:
        sock.close()
        raise
    policy = HostPolicy(config.host, sock.getsockname()[1], list(config.public_names))
    app = ConsoleApp(index, publish_label, config=config, policy=policy, accounts=accounts, audit=audit,
                     proxy=proxy if proxy is not None else ProxyIdentity("", ""), clock=clock,
                     throttle=throttle)
    protocol = type("ConsoleH11", (DeadlineH11,), {
        "request_timeout_s": config.request_timeout_s, "per_address": config.max_connections_per_address,
        "uncapped": staticmethod(app.proxy.trusted), "by_address": {}})
    # uvicorn's own start/stop lines repeat "console ready" and carry an ANSI-coloured copy as a log field
    logging.getLogger("uvicorn.error").setLevel(max(logging.WARNING, logging.getLogger("uvicorn.error").level))
    context = _tls_context(config, sock) if config.tls else None  # before the thread: a bad key fails the start
    server = uvicorn.Server(uvicorn.Config(
        ConsoleASGI(app), http=protocol, lifespan="off", access_log=False, log_config=None, server_header=False,
        limit_concurrency=config.max_connections, timeout_keep_alive=max(1, int(config.keep_alive_s)),
        timeout_graceful_shutdown=2, proxy_headers=False,  # forwarded addresses: ProxyIdentity, from its proxies only
        ssl_context_factory=(lambda _config, _default: context) if context else None))
    server.config.load()
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), name="console-http",
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        raise ConsoleError("the console's HTTP server did not start (see the log)")
    return ConsoleServer(app, server, sock, thread)


def _tls_context(config: ConsoleConfig, sock: socket.socket):
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        raise ConsoleError(f"TLS certificate or key unusable: {exc}") from exc
    return context
