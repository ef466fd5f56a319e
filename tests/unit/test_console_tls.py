"""The review console over TLS: HTTPS with the configured certificate, Secure __Host- session cookies,
HSTS, and a plain-HTTP client on the TLS port answered with nothing while the server keeps serving."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import urllib.request

import pytest
from modpipe.console.audit import AuditLog
from modpipe.console.auth import Accounts
from modpipe.console.index import DecisionIndex
from modpipe.console.server import ConsoleConfig, serve

PASSWORD = "correct horse battery"


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate for localhost and 127.0.0.1 (openssl's command line)."""
    if not shutil.which("openssl"):
        pytest.fail("the openssl command is needed to make a test certificate", pytrace=False)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_tls_console_signs_in_over_https_with_a_secure_host_only_cookie(tmp_path, certificate):
    cert, key = certificate
    accounts = Accounts(tmp_path / "accounts.json")
    accounts.add("ann", PASSWORD)
    server = serve(DecisionIndex(), lambda label: label,
                   config=ConsoleConfig(tls_cert=str(cert), tls_key=str(key)), accounts=accounts,
                   audit=AuditLog(tmp_path / "audit.jsonl"))
    port = server.server_address[1]
    try:
        assert server.url == f"https://localhost:{port}/"
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:  # plain HTTP: no answer
            raw.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            try:
                answer = raw.recv(100)
            except ConnectionError:
                answer = b""
            assert not answer.startswith(b"HTTP/")
        context = ssl.create_default_context(cafile=str(cert))
        request = urllib.request.Request(f"https://localhost:{port}/api/login", method="POST",
                                         data=json.dumps({"name": "ann", "password": PASSWORD}).encode(),
                                         headers={"Content-Type": "application/json",
                                                  "Origin": f"https://localhost:{port}"})
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            cookie = response.headers["Set-Cookie"]
            assert response.status == 200 and response.headers["Strict-Transport-Security"]
        flags = {f.strip() for f in cookie.split(";")}
        assert cookie.startswith("__Host-modpipe_session=") and {"Secure", "HttpOnly", "SameSite=Strict"} <= flags
        me = urllib.request.Request(f"https://localhost:{port}/api/me", headers={"Cookie": cookie.split(";")[0]})
        with urllib.request.urlopen(me, timeout=5, context=context) as response:
            assert json.loads(response.read())["moderator"] == "ann"
    finally:
        server.shutdown()
