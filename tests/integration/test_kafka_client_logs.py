"""A clean shutdown prints no alarm: against a real local broker (Apache Kafka, or MODPIPE_BROKER=embedded), a client closed before the broker
stops logs nothing; one still connected when it stops logs its `FAIL ... Disconnected` as a structured
librdkafka record (seen at DEBUG, quiet at INFO), never as a raw `%6|...` line on stderr."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys, time
from pathlib import Path
from confluent_kafka import Producer
from modpipe import log
from modpipe.services.broker import local_broker
from modpipe.services.process import free_port
from modpipe.settings import Settings
level, close_first, data = sys.argv[1], sys.argv[2] == "close", Path(sys.argv[3])
log.configure("WARNING", "json")  # the broker's own start-up lines are not what is checked
broker = local_broker(Settings.from_env(), data_dir=data / "data", port=free_port(), log_dir=data).start()
log.configure(level, "json")
producer = Producer({**Settings.from_env({}).kafka_client_config(), "bootstrap.servers": broker.bootstrap})
producer.produce("shutdown-probe", b"x")
assert producer.flush(30) == 0
if close_first:
    producer.close()
broker.stop()
if not close_first:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        producer.poll(0.2)
    producer.close()
"""


def _stderr(tmp_path: Path, level: str, close_first: bool) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, level, "close" if close_first else "keep", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert not [ln for ln in lines if ln.startswith("%")], lines  # no raw librdkafka line, ever
    return lines


def test_clients_closed_before_the_broker_stops_log_nothing(tmp_path):
    assert _stderr(tmp_path, "INFO", close_first=True) == []


def test_a_disconnection_is_a_structured_record(tmp_path):
    records = [json.loads(ln) for ln in _stderr(tmp_path, "DEBUG", close_first=False)]
    ours = [r for r in records if r["logger"] == "librdkafka"]
    assert any("Disconnected" in r["msg"] and r["level"] == "info" for r in ours), records
