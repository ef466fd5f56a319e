"""librdkafka's log lines reach the structured logger, not stderr as raw `%3|...|FAIL|...` lines.

A real confluent-kafka producer (no broker needed) is pointed at a port nothing listens on, in a fresh
interpreter so that the process's own stderr (file descriptor 2, where librdkafka writes by default) is read."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from modpipe import log
from modpipe.services.process import free_port

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import logging, time
from confluent_kafka import Producer
from modpipe import log
from modpipe.settings import Settings
log.configure("INFO", "json")
seen = []
log.kafka_client_logger().addFilter(lambda record: seen.append(record) or True)
conf = {**Settings.from_env({}).kafka_client_config(), "bootstrap.servers": "127.0.0.1:%d"}
producer = Producer(conf)
deadline = time.monotonic() + 10
while not seen and time.monotonic() < deadline:
    producer.poll(0.2)  # serves the client's log queue
producer.close()
"""


def test_client_logs_are_structured_records_of_the_librdkafka_logger():
    out = subprocess.run([sys.executable, "-c", PROBE % free_port()], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert lines, "a refused connection is logged"
    assert not [ln for ln in lines if ln.startswith("%")], lines  # no raw librdkafka line
    records = [json.loads(ln) for ln in lines]
    assert {r["logger"] for r in records} == {"librdkafka"}
    assert any(r["level"] == "error" and "Connection refused" in r["msg"] for r in records), records


def test_librdkafka_info_is_quieted_unless_debugging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        log.configure("INFO", "text")
        assert log.kafka_client_logger().getEffectiveLevel() == logging.WARNING
        log.configure("DEBUG", "text")
        assert log.kafka_client_logger().getEffectiveLevel() == logging.DEBUG
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        log.kafka_client_logger().setLevel(logging.NOTSET)
