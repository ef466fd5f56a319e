"""The console's HTTP side: one page (static HTML + JS, no build step) over a small JSON API.

    GET  /                      the page            GET /api/queue        review queue, oldest first
    GET  /api/blocks            recent blocks       GET /api/post/<id>    one post with features and revisions
    GET  /api/user/<id>         a user's posts      GET /api/search?q=    post_id or user_id
    GET  /api/stats             chart data          POST /api/label       {"post_id", "label": spam|ham}
    GET  /login?token=T&moderator=NAME             sets the session cookie, then redirects to /

Post texts are hostile input: the API returns them as JSON and the page puts them into the DOM as text
only (textContent, never innerHTML); a Content-Security-Policy allows no inline script and nothing from
elsewhere. Bound to 127.0.0.1 by default; any other bind needs a token (MODPIPE_CONSOLE_TOKEN), given once
at /login and kept in an HttpOnly cookie. The moderator id of a label is the session's.
"""

from __future__ import annotations

import hmac
import http.server
import ipaddress
import json
import secrets
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from console.index import DecisionIndex
from modpipe import log

_log = log.get(__name__)

STATIC = Path(__file__).parent / "static"
PAGES = {"/": ("console.html", "text/html; charset=utf-8"), "/console.js": ("console.js", "text/javascript"),
         "/console.css": ("console.css", "text/css")}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
MAX_BODY = 10_000
MODERATOR_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-@")


class ConsoleError(ValueError):
    """A configuration the console refuses (e.g. a public bind without a token)."""


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Sessions:
    """Session id -> moderator id (in memory: a restart logs everyone out)."""

    def __init__(self):
        self._sessions: dict[str, str] = {}
        self._lock = threading.Lock()

    def create(self, moderator: str) -> str:
        sid = secrets.token_urlsafe(24)
        with self._lock:
            self._sessions[sid] = moderator
        return sid

    def moderator(self, sid: str | None) -> str | None:
        with self._lock:
            return self._sessions.get(sid or "")


def valid_moderator(name: str) -> bool:
    return 0 < len(name) <= 64 and set(name) <= MODERATOR_CHARS


def make_handler(index: DecisionIndex, publish_label: Callable[[dict], None], *, token: str,
                 sessions: Sessions, default_moderator: str):
    """The request handler class bound to one index, label publisher and session store."""

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "modpipe-console"
        sys_version = ""

        def log_message(self, fmt, *args):  # structured log instead of stderr lines
            _log.debug("http", extra={"request": fmt % args})

        # -- helpers
        def _send(self, status: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for k, v in {**SECURITY_HEADERS, **(headers or {})}.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, status: int, obj) -> None:
            self._send(status, json.dumps(obj).encode(), "application/json")

        def _cookie(self, name: str) -> str | None:
            for part in (self.headers.get("Cookie") or "").split(";"):
                k, _, v = part.strip().partition("=")
                if k == name:
                    return v
            return None

        def _moderator(self) -> str | None:
            """The session's moderator; without a token a local console has a default moderator."""
            moderator = sessions.moderator(self._cookie("modpipe_session"))
            if moderator is None and not token:
                return default_moderator
            return moderator

        # -- routes
        def do_HEAD(self):  # noqa: N802 - http.server's naming
            self.do_GET()

        def do_GET(self):  # noqa: N802
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            if url.path == "/login":
                return self._login(query)
            if url.path == "/healthz":
                return self._json(200, {"ok": True})
            if self._moderator() is None:
                if url.path.startswith("/api/"):
                    return self._json(401, {"error": "log in first: /login?token=...&moderator=..."})
                return self._send(401, b"modpipe console: open /login?token=TOKEN&moderator=YOUR_ID", "text/plain")
            if url.path in PAGES:
                name, content_type = PAGES[url.path]
                return self._send(200, (STATIC / name).read_bytes(), content_type)
            if url.path == "/api/queue":
                return self._json(200, index.queue(_int(query, "limit", 100)))
            if url.path == "/api/blocks":
                return self._json(200, {"posts": index.blocks(_int(query, "limit", 50))})
            if url.path == "/api/stats":
                return self._json(200, index.stats(_int(query, "window", 120)))
            if url.path == "/api/me":
                return self._json(200, {"moderator": self._moderator()})
            if url.path == "/api/search":
                return self._json(200, index.search((query.get("q") or [""])[0]))
            for prefix, get in (("/api/post/", index.post), ("/api/user/", index.user)):
                if url.path.startswith(prefix):
                    found = get(urllib.parse.unquote(url.path[len(prefix):]))
                    return self._json(200, found) if found is not None else self._json(404, {"error": "not found"})
            return self._json(404, {"error": "not found"})

        def do_POST(self):  # noqa: N802
            url = urllib.parse.urlsplit(self.path)
            moderator = self._moderator()
            if moderator is None:
                return self._json(401, {"error": "log in first"})
            if url.path != "/api/label":
                return self._json(404, {"error": "not found"})
            # A form post from another site cannot set this header: no cross-site label forgery.
            if self.headers.get("X-Requested-With") != "modpipe-console":
                return self._json(403, {"error": "missing X-Requested-With: modpipe-console"})
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY:
                return self._json(400, {"error": "a JSON body of at most 10 kB is required"})
            try:
                body = json.loads(self.rfile.read(length))
                post_id, label = str(body["post_id"]), body["label"]
            except (ValueError, KeyError, TypeError):
                return self._json(400, {"error": "body must be {\"post_id\": ..., \"label\": \"spam\"|\"ham\"}"})
            if label not in ("spam", "ham"):
                return self._json(400, {"error": "label must be spam or ham"})
            post = index.post(post_id)
            if post is None or not post.get("user_id"):
                return self._json(404, {"error": f"unknown post {post_id[:80]!r}"})
            try:
                record = publish_label({"post_id": post_id, "user_id": post["user_id"], "label": label,
                                        "moderator_id": moderator})
            except Exception as exc:  # noqa: BLE001 - the broker is away: the moderator must know it did not land
                _log.error("label not published", extra={"post_id": post_id, "error": str(exc)[:300]})
                return self._json(503, {"error": f"label not published: {str(exc)[:200]}"})
            return self._json(200, {"ok": True, "label": record})

        def _login(self, query) -> None:
            given = (query.get("token") or [""])[0]
            moderator = (query.get("moderator") or [default_moderator])[0]
            if token and not hmac.compare_digest(given.encode(), token.encode()):
                return self._send(403, b"wrong token", "text/plain")
            if not valid_moderator(moderator):
                return self._send(400, b"moderator: 1-64 letters, digits or ._-@", "text/plain")
            sid = sessions.create(moderator)
            self._send(303, b"", "text/plain",
                       {"Location": "/", "Set-Cookie": f"modpipe_session={sid}; HttpOnly; SameSite=Strict; Path=/"})

    return Handler


def _int(query: dict, name: str, default: int) -> int:
    try:
        return max(1, min(10_000, int((query.get(name) or [default])[0])))
    except ValueError:
        return default


def serve(index: DecisionIndex, publish_label: Callable[[dict], None], *, host: str, port: int, token: str = "",
          default_moderator: str = "local") -> http.server.ThreadingHTTPServer:
    """Start serving in a daemon thread; returns the server (`shutdown()` stops it)."""
    if not is_loopback(host) and not token:
        raise ConsoleError(f"binding {host} (not loopback) needs MODPIPE_CONSOLE_TOKEN: anyone who reaches the "
                           "port could label posts")
    handler = make_handler(index, publish_label, token=token, sessions=Sessions(),
                           default_moderator=default_moderator)
    server = http.server.ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="console-http", daemon=True).start()
    return server
