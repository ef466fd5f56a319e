"""The load report: decisions collected, the summary computed from them, its table."""

from __future__ import annotations

import orjson
import pytest
from modpipe.loadgen.measure import (
    Decided,
    DecisionCollector,
    format_table,
    summarize,
)

from modpipe import schema


def _decision(pid, verdict, revision=1):
    post = {"post_id": pid, "user_id": "u"}
    return schema.dumps(schema.decision(post=post, verdict=verdict, spam_probability=0.5, text_probability=0.5,
                                        reasons=[], features={}, short_circuit=None, model_versions={},
                                        received_at_ms=1000, decided_at_ms=1040, revision=revision))


def test_collector_keeps_first_decision_counts_revisions_and_ignores_others():
    c = DecisionCollector(consumer=None, prefix="run1-")
    c.handle(_decision("run1-p1", "allow"), 10.0)
    c.handle(_decision("run1-p1", "block", revision=2), 11.0)
    c.handle(_decision("other-p1", "block"), 10.0)
    c.handle(b"not json", 10.0)
    d = c.snapshot()
    assert set(d) == {"run1-p1"} and c.invalid == 1
    assert (d["run1-p1"].verdict, d["run1-p1"].received, d["run1-p1"].count) == ("allow", 10.0, 2)
    assert (d["run1-p1"].last_verdict, d["run1-p1"].pipeline_latency_ms) == ("block", 40)


class _Msg:
    def __init__(self, kind: int, ts_ms: int):
        self._ts = (kind, ts_ms)

    def timestamp(self):
        return self._ts


def test_summarize():
    sent_at = {f"p{i}": 100.0 + i * 0.1 for i in range(10)}
    truth = {pid: {"is_spam": i < 4, "actor": "spammer" if i < 4 else "legit", "campaign": "c0" if i < 4 else None,
                   "scenario": "mixed", "text_label": "spam", "dataset": "sms"} for i, pid in enumerate(sent_at)}
    verdicts = ["block", "review", "allow", "block", "allow", "allow", "review", "allow", "allow"]  # p9 lost
    decided = {f"p{i}": Decided(sent_at[f"p{i}"] + 0.05 * (i + 1), v, 0.5, 10.0) for i, v in enumerate(verdicts)}
    decided["unrelated"] = Decided(0.0, "block", 1.0, 1.0)
    decided["p8"].received = 103.7  # a straggler: the seconds between have no decisions
    # the producer kept up with p0-p3 and was 0.2 s late for p4-p9
    scheduled_at = {pid: t - (0.2 if i >= 4 else 0.0) for i, (pid, t) in enumerate(sent_at.items())}
    r = summarize(sent_at=sent_at, scheduled_at=scheduled_at, truth=truth, decided=decided, produce_started=100.0, produce_finished=101.0,
                  events_by_kind={"post": 10, "report": 2}, lag_samples=[(100.5, 3, 7), (101.5, 0, None)],
                  config={"scenario": "mixed"})
    assert r["decided"] == 9 and r["lost"] == 1 and r["sent"]["posts"] == 10
    assert r["throughput"]["produce_posts_per_s"] == pytest.approx(10.0)
    produced, lat = r["latency_from_produce_ms"], r["latency_ms"]
    assert produced["p50_ms"] == pytest.approx(250.0) and produced["max_ms"] == pytest.approx(2900.0)
    # from the schedule p4-p8 waited 200 ms more: the median post, p4, 250 + 200 ms
    assert lat["p50_ms"] == pytest.approx(450.0) and lat["max_ms"] == pytest.approx(3100.0)
    assert lat["n"] == produced["n"] == 9
    for q in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms"):
        assert lat[q] >= produced[q]
    assert lat["p50_ms"] <= lat["p95_ms"] <= lat["p99_ms"] <= lat["max_ms"]
    assert r["breakdown"]["actor=legit"]["p50_ms"] == pytest.approx(550.0)  # p4-p8 from the schedule
    rb, blk = r["accuracy"]["review_or_block"], r["accuracy"]["block"]
    assert (rb["tp"], rb["fp"], rb["fn"], rb["tn"]) == (3, 1, 1, 4)
    assert (blk["tp"], blk["fp"], blk["fn"], blk["tn"]) == (2, 0, 2, 5)
    assert r["accuracy"]["confusion"]["ham"] == {"allow": 4, "review": 1, "block": 0}
    assert r["breakdown"]["actor=spammer"]["flagged_rate"] == 0.75
    assert r["breakdown"]["actor=legit"]["posts"] == 6 and r["breakdown"]["actor=legit"]["decided"] == 5
    assert r["lag"]["max"] == 3 and r["lag"]["last"] == 0 and r["lag"]["group_max"] == r["lag"]["group_last"] == 7
    assert [row["t"] for row in r["timeseries"]] == list(range(len(r["timeseries"])))  # no gaps
    assert sum(row["produced"] for row in r["timeseries"]) == 10
    assert sum(row["decided"] for row in r["timeseries"]) == 9
    orjson.dumps(r)  # JSON-able
    table = format_table(r)
    assert "review_or_block" in table and "actor=spammer" in table
    assert "p50 450.0  p95" in table and "from each post's scheduled time" in table
    assert "p50 250.0  p95" in table and "from its produce() call" in table


def test_rss_summary_reports_growth_after_warmup_per_process_group():
    from modpipe.loadgen.measure import rss_summary

    samples = [(100.0 + 10 * i, {"worker-0": 200.0 + (50 if i < 2 else 0) + i, "triton": 900.0}) for i in range(12)]
    out = rss_summary(samples, t0=100.0)
    assert out["triton"] == {"first": 900.0, "after_warmup": 900.0, "peak": 900.0, "last": 900.0,
                             "growth_after_warmup": 0.0}
    w = out["worker-0"]
    assert w["first"] == 250.0 and w["after_warmup"] == 203.0 and w["last"] == 211.0 and w["peak"] == 251.0
    assert w["growth_after_warmup"] == 8.0
    assert out["samples"][0] == [0.0, samples[0][1]] and len(out["samples"]) == 12


def test_group_rss_counts_this_process_group():
    import os

    from modpipe.loadgen.measure import group_rss_mib

    assert group_rss_mib(os.getpgid(0)) > 10  # this test process alone holds more than 10 MiB
    assert group_rss_mib(2 ** 22 + 12345) == 0  # no such group
