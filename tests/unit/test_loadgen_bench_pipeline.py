"""The pipeline passes' rate arithmetic."""

from __future__ import annotations

import pytest

from loadgen.bench.pipeline import saturation_rates


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
