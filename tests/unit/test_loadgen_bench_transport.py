"""`modpipe bench transport`: its pure parts (percentiles, ratios, checks, profile summaries, the table)."""

from __future__ import annotations

import time

import pytest
from modpipe.loadgen.bench.transport import _Epoch, _Pacer
from modpipe.loadgen.bench.transport_report import (
    BASELINE,
    add_ratios,
    checks_ok,
    format_text,
    percentile,
    top_own_time,
)


def _pass(option: str, rps: float, cpu: float, interval: int = 100, **kw) -> dict:
    p = {"option": option, "interval_ms": interval, "records": 1000, "inputs": 100, "records_per_s": rps,
         "cpu_us_per_record": cpu, "main_thread_us_per_record": cpu / 2, "broker_cpu_us_per_record": None,
         "commits": 3, "commit_ms_p50": 1.0, "commit_ms_p99": 2.5, "read_committed": 1000, "read_uncommitted": 1000,
         "offsets_committed": 100}
    return {**p, **kw}


def test_percentile_interpolates_between_ranks_like_numpy():
    assert percentile([], 50) is None
    assert percentile([7.0], 99) == 7.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert percentile([1.0, 2.0], 0) == 1.0 and percentile([1.0, 2.0], 100) == 2.0


def test_ratios_are_over_the_baseline_option():
    passes = add_ratios([_pass(BASELINE, 100_000, 2.0), _pass("confluent_txn", 250_000, 1.0),
                         _pass("aiokafka_txn", 50_000, 8.0)])
    assert [(p["throughput_ratio"], p["cpu_ratio"]) for p in passes] == [(1.0, 1.0), (2.5, 0.5), (0.5, 4.0)]


def test_ratios_are_none_without_a_baseline():
    (p,) = add_ratios([_pass("confluent_txn", 1.0, 1.0)])
    assert p["throughput_ratio"] is None and p["cpu_ratio"] is None


def test_checks_need_both_isolation_levels_and_every_offset():
    assert checks_ok(_pass(BASELINE, 1, 1))
    assert not checks_ok(_pass(BASELINE, 1, 1, read_committed=990))
    assert not checks_ok(_pass(BASELINE, 1, 1, read_uncommitted=1010))
    assert not checks_ok(_pass(BASELINE, 1, 1, offsets_committed=99))


def test_profile_summary_by_function_and_by_file():
    stats = {("~", 0, "<method 'produce' of 'cimpl.Producer' objects>"): (1, 1, 0.006, 0.006, {}),
             ("/x/aiokafka/producer/producer.py", 426, "send"): (1, 1, 0.003, 0.009, {}),
             ("/x/aiokafka/producer/producer.py", 500, "flush"): (1, 1, 0.001, 0.001, {})}
    by_fn = top_own_time(stats, records=1000, by="function", top=2)
    assert by_fn == [{"function": "<method 'produce' of 'cimpl.Producer' objects>", "share": 0.6, "us_per_record": 6.0},
                     {"function": "producer.py:426(send)", "share": 0.3, "us_per_record": 3.0}]
    by_file = top_own_time(stats, records=1000, by="file")
    assert by_file == [{"file": "builtins", "share": 0.6, "us_per_record": 6.0},
                       {"file": "producer/producer.py", "share": 0.4, "us_per_record": 4.0}]


def test_table_has_a_row_per_option_and_the_profiles():
    sat = add_ratios([_pass(BASELINE, 100_000, 2.0), _pass("confluent_txn", 300_000, 1.5, interval=50)])
    paced = add_ratios([_pass(BASELINE, 10_000, 5.0), _pass("confluent_txn", 10_000, 6.0, interval=50,
                                                            commit_ms_p50=None, commit_ms_p99=None, commits=0)])
    report = {"records": 1000, "inputs": 100, "paced_inputs_per_s": 1000.0, "paced_records": 1000,
              "workload": {"records_per_input": 10, "value_bytes": 300, "partitions": 4, "topics": 3, "linger_ms": 5,
                           "baseline": BASELINE},
              "saturation": sat, "paced": paced, "all_checks_ok": True, "cpus": 2,
              "machine": {"wall_s": 95.4, "other_cores": 0.03},
              "idle_consumers": {"aiokafka": {"client_cores": 0.86, "broker_cores": None}},
              "profiles": {"confluent_txn@100ms": {"function": [{"function": "produce", "share": 0.5,
                                                                 "us_per_record": 1.0}]}}}
    text = format_text(report)
    rows = [line for line in text.splitlines() if line.startswith("| confluent")]
    assert len(rows) == 2 and "| 300,000 |" in rows[1] and "| 3.00 |" in rows[1] and "1.20" in rows[1]
    assert "- / - (0)" in rows[1]  # no commit measured: a dash, not a crash
    assert "committed: yes" in text and "50.0%" in text and "produce" in text
    assert "end of its log, aiokafka (the passes pause theirs): 0.86 cores, the broker meanwhile -" in text
    assert "other processes took 0.03 cores on average while it ran (95 s, 2 cores)" in text
    header, rule = text.splitlines()[2:4]
    assert header.count("|") == rule.count("|")


def test_pacer_hands_out_all_or_what_the_rate_allows():
    pacer = _Pacer(None)
    pacer.buf.extend(range(2500))
    assert len(pacer.take(0)) == 1000  # one round of at most `batch`
    paced = _Pacer(100.0)
    paced.buf.extend(range(50))
    paced.t0 = time.perf_counter() - 0.1  # 0.1 s in: ~11 inputs are due
    assert 10 <= len(paced.take(0)) <= 12
    assert paced.take(50) == []


def test_epoch_counts_deliveries_and_errors():
    epoch = _Epoch()
    epoch.left += 3
    epoch.ack(None, None)
    epoch.ack("boom", None)
    assert epoch.left == 1 and epoch.errors == 1
