"""`modpipe bench transport` on a tiny load against the real embedded broker.

Not a timed test: every option runs, reports positive throughput, and what it produced is exactly what a
read_committed and a read_uncommitted consumer read, with every input's offset committed."""

from __future__ import annotations

import orjson
import pytest
from modpipe.loadgen.bench.transport import run
from modpipe.loadgen.bench.transport_report import format_text

pytestmark = pytest.mark.integration


def test_every_option_delivers_exactly_what_it_produced(bootstrap):
    report = run(bootstrap, records=2000, intervals_ms=(100,), aiokafka_intervals_ms=(100,), paced_rate=1000,
                 paced_s=0.5, progress=False)
    orjson.dumps(report)
    options = ["confluent_idempotent", "confluent_txn", "aiokafka_txn", "aiokafka_plain"]
    for kind, records in (("saturation", 2000), ("paced", 5000)):
        passes = report[kind]
        assert [p["option"] for p in passes] == options
        for p in passes:
            assert p["records"] == records and p["records_per_s"] > 0 and p["cpu_us_per_record"] > 0, p
            assert p["read_committed"] == p["read_uncommitted"] == records, p
            assert p["offsets_committed"] == records // 10 and p["commits"] >= 1, p
    assert report["all_checks_ok"]
    assert set(report["profiles"]) == {"confluent_txn@100ms", "aiokafka_txn@100ms"}
    assert all(report["profiles"][name]["function"] for name in report["profiles"])
    assert set(report["idle_consumers"]) == {"confluent", "aiokafka"}
    assert "confluent_txn" in format_text(report)
