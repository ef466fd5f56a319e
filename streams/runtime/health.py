"""The worker's HTTP endpoints on its metrics port: `/metrics` (Prometheus), `/livez` and `/readyz`.

Readiness means the worker decides promptly and correctly: it has read the ban log to its end, warmed its
text-model and decision paths, and been given its partitions. Liveness fails only for what a restart cures
(the ban log reader died). Both answer JSON naming each check, 200 when all pass, 503 otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
from modpipe.streams import metrics
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

Check = Callable[[], bool]
READY_PATH, LIVE_PATH = "/readyz", "/livez"


class Health:
    """Named readiness and liveness checks (plain callables, evaluated on each request)."""

    def __init__(self) -> None:
        self.ready_checks: dict[str, Check] = {}
        self.live_checks: dict[str, Check] = {}

    @staticmethod
    def _run(checks: dict[str, Check]) -> tuple[bool, dict[str, bool]]:
        results = {}
        for name, check in checks.items():
            try:
                results[name] = bool(check())
            except Exception:  # noqa: BLE001 - a check that cannot answer fails
                results[name] = False
        return all(results.values()), results

    def readiness(self) -> tuple[bool, dict[str, bool]]:
        ok, results = self._run({**self.live_checks, **self.ready_checks})
        metrics.WORKER_READY.set(1 if ok else 0)
        return ok, results

    def liveness(self) -> tuple[bool, dict[str, bool]]:
        return self._run(self.live_checks)


def _handler(health: Health):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            if path in ("/", "/metrics"):
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif path in (READY_PATH, LIVE_PATH):
                ok, checks = health.readiness() if path == READY_PATH else health.liveness()
                self._send(200 if ok else 503, orjson.dumps({"ok": ok, "checks": checks}), "application/json")
            else:
                self._send(404, b'{"error": "not found"}', "application/json")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:  # probes every few seconds: not worth a log line each
            pass

    return Handler


def serve(host: str, port: int, health: Health) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), _handler(health))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="health-http", daemon=True).start()
    return server
