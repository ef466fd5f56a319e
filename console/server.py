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
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import math
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from console.audit import AuditLog
from console.auth import (
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
from console.index import DecisionIndex
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
            if session is not None and session.via == "proxy" and session.user == proxy_user:
                return session, {}
            account = self.accounts.get(proxy_user)
            session = self.sessions.create(proxy_user, account.role if account else self.proxy.role, "proxy")
            _log.info("console sign-in", extra={"moderator": proxy_user, "role": session.role, "via": "proxy"})
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
        url = urllib.parse.urlsplit(path)
        if url.path == "/healthz":
            return Reply(200, {"ok": True})
        if not self.policy.allows_host(headers.get("Host")):
            return Reply(421, {"error": "this console is not reached by that name (Host); see "
                                        "MODPIPE_CONSOLE_PUBLIC_NAME"})
        if method == "POST" and not self._same_origin(headers):
            return Reply(403, {"error": "writes must come from the console's own page (Origin)"})
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
        keys = [f"address:{address}", f"name:{name.lower()[:64]}"]
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
            _log.warning("console sign-in failed", extra={"account": name[:64], "client": address})
            return Reply(401, {"error": "wrong name or password"})
        self.throttle.succeeded(keys)
        session = self.sessions.create(account.name, account.role, "password")
        _log.info("console sign-in", extra={"moderator": account.name, "role": account.role, "via": "password",
                                            "client": address})
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
            _log.error("label not published", extra={"post_id": post_id, "error": str(exc)[:300]})
            return Reply(503, {"error": f"label not published: {str(exc)[:200]}"})
        entry = {"at": record.get("created_at") or schema.rfc3339(schema.now_ms()), "moderator": session.user,
                 "role": session.role, "via": session.via, "post_id": post_id, "user_id": post["user_id"],
                 "label": label, "verdict_before": post.get("verdict"), "revision_before": post.get("revision"),
                 "label_before": post.get("label"), "labelled_by_before": post.get("labelled_by")}
        try:
            self.audit.append(entry)
        except OSError as exc:  # published but not audited: the log line keeps the audit entry
            _log.error("label published but not audited", extra={**entry, "error": str(exc)})
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
    try:
        return max(1, min(10_000, int((query.get(name) or [default])[0])))
    except ValueError:
        return default


def make_handler(app: ConsoleApp):
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "modpipe-console"
        sys_version = ""
        timeout = 30  # a client that stalls mid-request gives its thread back

        def setup(self):
            if isinstance(self.request, ssl.SSLSocket):  # the handshake in this thread, not the accept loop
                self.request.settimeout(self.timeout)
                self.request.do_handshake()
            super().setup()

        def log_request(self, code="-", size="-"):  # the path without its query, as a structured line
            _log.debug("http", extra={"method": self.command, "path": urllib.parse.urlsplit(self.path).path,
                                      "status": str(code), "client": self.client_address[0]})

        def log_message(self, fmt, *args):
            _log.debug("http error", extra={"client": self.client_address[0], "error": (fmt % args)[:200]})

        def _reply(self, reply: Reply) -> None:
            body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(body)))
            if app.config.tls:
                self.send_header("Strict-Transport-Security", "max-age=31536000")
            for k, v in {**SECURITY_HEADERS, **reply.headers}.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _serve(self, method: str, body: bytes | None = None) -> None:
            try:
                reply = app.handle(method, self.path, self.headers, self.client_address[0], body)
            except Exception:  # a bug answers 500, not a dropped connection
                _log.exception("console request failed", extra={"method": method,
                                                                "path": urllib.parse.urlsplit(self.path).path})
                reply = Reply(500, {"error": "internal error (see the console's log)"})
            self._reply(reply)

        def do_GET(self):  # noqa: N802 - http.server's naming
            self._serve("GET")

        def do_HEAD(self):  # noqa: N802
            self._serve("GET")

        def do_POST(self):  # noqa: N802
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 < length <= MAX_BODY:
                return self._reply(Reply(400, {"error": f"a JSON body of at most {MAX_BODY} bytes is required"}))
            self._serve("POST", self.rfile.read(length))

    return Handler


class ConsoleHTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # e.g. plain HTTP to the TLS port: one line, no traceback
        _log.debug("connection error", extra={"client": client_address[0], "error": repr(sys.exc_info()[1])[:200]})

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        scheme = "https" if isinstance(self.socket, ssl.SSLSocket) else "http"
        return f"{scheme}://{'localhost' if is_loopback(host) else host}:{port}/"


def serve(index: DecisionIndex, publish_label: Callable[[dict], dict], *, config: ConsoleConfig,
          accounts: Accounts, audit: AuditLog, proxy: ProxyIdentity | None = None,
          clock: Callable[[], float] = time.time, throttle: LoginThrottle | None = None) -> ConsoleHTTPServer:
    """Start serving in a daemon thread; returns the server (`shutdown()` stops it)."""
    config.check()
    context = None
    if config.tls:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(config.tls_cert, config.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConsoleError(f"TLS certificate or key unusable: {exc}") from exc
    server = ConsoleHTTPServer((config.host, config.port), http.server.BaseHTTPRequestHandler)
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    policy = HostPolicy(config.host, server.server_address[1], list(config.public_names))
    app = ConsoleApp(index, publish_label, config=config, policy=policy, accounts=accounts, audit=audit,
                     proxy=proxy or ProxyIdentity("", ""), clock=clock, throttle=throttle)
    server.RequestHandlerClass = make_handler(app)
    server.app = app
    threading.Thread(target=server.serve_forever, name="console-http", daemon=True).start()
    return server
