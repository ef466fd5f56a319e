"""The report's ratios, targets and capacity line."""

from __future__ import annotations

from loadgen.bench.report import TARGETS, capacity, ratio, targets


def test_ratios_and_targets():
    assert ratio(30.0, 12.0) == 2.5 and ratio(None, 2.0) is None and ratio(1.0, 0.0) is None
    t = targets({"worker_cpu_ms_per_post": 1.0, "broker_cpu_ms_per_post": 1.6, "pipeline_over_sorted_ceiling": 0.95,
                 "low_rate_p50_ms": 59.0, "low_rate_p99_ms": 201.0})
    assert set(t) == set(TARGETS)
    assert t["worker_cpu_ms_per_post"] == {"target": 1.0, "direction": "max", "value": 1.0, "met": True}
    assert t["broker_cpu_ms_per_post"]["met"] is False  # a "max" target exceeded
    assert t["pipeline_over_sorted_ceiling"]["met"] is True and t["low_rate_p50_ms"]["met"] is True
    assert t["low_rate_p99_ms"]["met"] is False
    assert t["load_p99_ms"] == {"target": 300.0, "direction": "max", "value": None, "met": False}  # not measured

def test_capacity_per_worker_core_beside_one_gpu():
    c = capacity(0.5, gpu_texts_per_s=18_000)
    assert c == {"posts_per_worker_core_s": 2000.0, "gpu_texts_per_s_reference": 18_000, "worker_cores_per_gpu": 9.0}
    assert capacity(None)["worker_cores_per_gpu"] is None
