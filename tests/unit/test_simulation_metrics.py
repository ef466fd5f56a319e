"""Metrics math shared by training and the load report: percentiles, precision/recall/F1, confusion."""

from __future__ import annotations

import numpy as np
import pytest
from modpipe.simulation.metrics import binary_metrics, confusion, latency_summary, percentile


@pytest.mark.parametrize("values", [[5.0], [1.0, 2.0], [3.0, 1.0, 2.0, 10.0], list(np.random.default_rng(0).random(101))])
@pytest.mark.parametrize("q", [0, 25, 50, 95, 99, 100])
def test_percentile_matches_numpy_linear(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_empty_and_summary_order():
    assert percentile([], 50) is None
    s = latency_summary(list(range(1, 1001)))
    assert s["p50_ms"] <= s["p95_ms"] <= s["p99_ms"] <= s["max_ms"] == 1000
    assert latency_summary([])["p50_ms"] is None


def test_binary_metrics_by_hand():
    truth = [True, True, True, False, False, False, False, True]
    pred = [True, True, False, True, False, False, False, False]
    m = binary_metrics(truth, pred)
    assert (m["tp"], m["fp"], m["fn"], m["tn"]) == (2, 1, 2, 3)
    assert m["precision"] == pytest.approx(2 / 3, abs=1e-4)
    assert m["recall"] == pytest.approx(0.5)
    assert m["f1"] == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5), abs=1e-4)
    assert m["false_positive_rate"] == pytest.approx(0.25) and m["accuracy"] == pytest.approx(5 / 8)


def test_binary_metrics_degenerate():
    m = binary_metrics([False, False], [False, False])  # no spam at all, none flagged
    assert m["precision"] is None and m["recall"] is None and m["f1"] is None and m["false_positive_rate"] == 0
    m = binary_metrics([True, False], [False, False])  # spam missed
    assert m["precision"] is None and m["recall"] == 0 and m["f1"] == 0
    with pytest.raises(ValueError):
        binary_metrics([True], [True, False])


def test_confusion():
    c = confusion([(True, "block"), (True, "allow"), (False, "review"), (False, "allow"), (False, "allow")])
    assert c == {"spam": {"allow": 1, "review": 0, "block": 1}, "ham": {"allow": 2, "review": 1, "block": 0}}
