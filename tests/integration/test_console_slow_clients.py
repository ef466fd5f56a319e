"""200 slow clients (a byte every 10 s, never a whole request) against a real uvicorn-served console on 127.0.0.1:
while the server holds every one of them, a moderator's page (the HTML, its assets and the API calls it makes)
loads in under 1 s, again and again; then the request deadline closes every slow connection. Needs no broker:
the console is served over a real index. Bounded: about 17 s, every socket closed at the end."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import argon2
import pytest
from modpipe.console.audit import AuditLog
from modpipe.console.auth import Accounts
from modpipe.console.index import DecisionIndex
from modpipe.console.server import ConsoleConfig, serve

from tests.unit.test_console import decision

SLOW_CLIENTS = 200
DRIP_S = 10.0
DEADLINE_S = 15.0  # the request deadline of this console: the slow clients are held through two drips
PAGE = ["/", "/console.css", "/console.js", "/api/me", "/api/queue?limit=100", "/api/blocks?limit=20",
        "/api/stats?window=120"]
PASSWORD = "a moderator's passphrase"


def load_page(port: int, cookie: str) -> float:
    """Seconds to fetch what the page fetches, over a new connection (as a browser opening it)."""
    started = time.monotonic()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        for path in PAGE:
            connection.request("GET", path, headers={"Cookie": cookie})
            response = connection.getresponse()
            body = response.read()
            assert response.status == 200, (path, body[:200])
    finally:
        connection.close()
    return time.monotonic() - started


@pytest.fixture
def console(tmp_path):
    accounts = Accounts(tmp_path / "accounts.json", argon2.PasswordHasher(time_cost=1, memory_cost=1024,
                                                                          parallelism=1))
    accounts.add("mod-7", PASSWORD)
    index = DecisionIndex()
    for i in range(500):
        index.add_post({"post_id": f"p{i}", "user_id": f"u{i % 40}", "text": "a post of some length " * 20})
        index.add_decision(decision(f"p{i}", verdict=("review", "allow", "block")[i % 3], user=f"u{i % 40}"))
    server = serve(index, lambda label: label, config=ConsoleConfig(request_timeout_s=DEADLINE_S),
                   accounts=accounts, audit=AuditLog(tmp_path / "audit.jsonl"))
    yield server
    server.shutdown()


def test_a_moderators_page_loads_in_under_a_second_while_200_slow_clients_hold_connections(console):
    port = console.server_address[1]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("POST", "/api/login", body=json.dumps({"name": "mod-7", "password": PASSWORD}),
                       headers={"Content-Type": "application/json", "Origin": f"http://127.0.0.1:{port}"})
    response = connection.getresponse()
    response.read()
    assert response.status == 200
    cookie = response.getheader("Set-Cookie").split(";")[0]
    connection.close()

    head = f"GET /api/queue HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Slow: ".encode()
    slow = []
    stop = threading.Event()
    try:
        for _ in range(SLOW_CLIENTS):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(head[:1])
            slow.append(s)
        started = time.monotonic()

        def drip():  # one more byte per client every DRIP_S, until stopped or the server closed it
            sent = 1
            while not stop.wait(DRIP_S):
                for s in slow:
                    try:
                        s.sendall(head[sent:sent + 1])
                    except OSError:
                        pass
                sent += 1

        dripper = threading.Thread(target=drip, daemon=True)
        dripper.start()
        loads, held = [], []
        for at in (1.0, 4.0, 7.0, 10.5, 13.0):  # before and after the second drip
            time.sleep(max(0.0, started + at - time.monotonic()))
            held.append(len(console._server.server_state.connections))
            loads.append(load_page(port, cookie))
        assert min(held) >= SLOW_CLIENTS, held  # every slow client was being held while the page loaded
        assert max(loads) < 1.0, loads

        # the deadline: every slow connection is closed by the server, unanswered
        time.sleep(max(0.0, started + DEADLINE_S + 1.0 - time.monotonic()))
        closed = 0
        for s in slow:
            s.settimeout(2)
            try:
                closed += s.recv(100) == b""
            except ConnectionResetError:
                closed += 1
        assert closed == SLOW_CLIENTS
        print(f"page loads with {SLOW_CLIENTS} slow clients held: {[round(x * 1000) for x in loads]} ms")
    finally:
        stop.set()
        for s in slow:
            s.close()
