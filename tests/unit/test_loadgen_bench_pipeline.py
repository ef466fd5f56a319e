"""The pipeline passes' rate and tail arithmetic."""

from __future__ import annotations

import pytest
from modpipe.loadgen.bench.pipeline import saturation_rates, where_the_tail_sits


def test_saturation_rates_count_an_interval_not_batches():
    # 100 decisions arriving in batches of 10, one batch per second, starting 5 s after the produce
    received = [5.0 + i // 10 for i in range(100)]
    r = saturation_rates(0.0, received)
    assert r["overall"] == pytest.approx(100 / 14, abs=0.01)
    # window (t(10)=6 s, t(89)=13 s]: batches at 7..13 s = 70 decisions in 7 s
    assert r["steady"] == pytest.approx(10.0) and r["steady_decisions"] == 70

def test_saturation_rates_without_a_window_fall_back_to_none():
    r = saturation_rates(0.0, [2.0] * 40)  # one batch: no interval to measure a rate over
    assert r["steady"] is None and r["overall"] == pytest.approx(20.0)
    assert saturation_rates(0.0, [])["overall"] is None


def test_the_tail_of_one_stall_is_one_episode_and_of_bursts_many():
    sent = {f"p{i}": 100.0 + i * 0.1 for i in range(400)}  # 10 posts/s for 40 s
    seen = {pid: t + 0.05 for pid, t in sent.items()}
    for i in (200, 201, 202, 203):  # one 0.4 s stall at 20 s
        seen[f"p{i}"] = sent[f"p{i}"] + 2.0
    stall = where_the_tail_sits(sent, seen, 100.0)
    assert stall["slowest_posts"] == 4 and stall["episodes"] == 1
    assert stall["produced_at_s"] == [20.0, 20.1, 20.2, 20.3]
    assert stall["mean_posts_per_s"] == pytest.approx(10.0)
    for i in (10, 150, 300, 390):  # slow posts spread over the pass
        seen[f"p{i}"] = sent[f"p{i}"] + 3.0
    spread = where_the_tail_sits(sent, seen, 100.0)
    assert spread["episodes"] == 4 and spread["produced_at_s"] == [1.0, 15.0, 30.0, 39.0]


def test_the_tail_counts_the_busiest_second():
    sent = {"a": 0.0, "b": 0.2, "c": 0.3, "d": 0.9, "e": 5.0}
    tail = where_the_tail_sits(sent, {k: v + 0.01 for k, v in sent.items()}, 0.0)
    assert tail["busiest_second_posts"] == 4 and tail["slowest_posts"] == 1


def test_the_tail_says_where_its_posts_waited():
    sent = {f"p{i}": float(i) for i in range(100)}
    worker = {pid: (t, t + 0.03) for pid, t in sent.items()}  # the verdict 30 ms after the produce
    published = {pid: t + 0.035 for pid, t in sent.items()}
    seen = {pid: t + 0.045 for pid, t in sent.items()}
    seen["p50"], published["p50"] = 50.0 + 0.9, 50.0 + 0.3  # a slow post: 270 ms to publish, 600 ms to commit
    tail = where_the_tail_sits(sent, seen, 0.0, published, worker)
    assert tail["slowest_waited"] == {"to_decided_ms": 30.0, "to_published_ms": 270.0, "to_visible_ms": 600.0}
    assert tail["all_waited"] == {"to_decided_ms": 30.0, "to_published_ms": 5.0, "to_visible_ms": 10.0}
    assert "slowest_waited" not in where_the_tail_sits(sent, seen, 0.0)  # without the decisions' times
