"""`modpipe bench` (no target): command-line routing and the pure math of the end-to-end comparison."""

from __future__ import annotations

import os

import pytest

from loadgen.bench import TARGETS, bench_posts, capacity, group_cpu_seconds, ratio, saturation_rates, targets
from modpipe.cli import build_parser


@pytest.mark.parametrize("argv, handler", [
    (["bench", "--json"], "_bench_e2e"),
    (["bench", "--posts", "50", "--workers", "2", "--markdown", "x.md"], "_bench_e2e"),
    (["bench", "model", "--json"], "_bench_model"),
    (["bench", "features", "--posts", "5"], "_bench_features"),
])
def test_bench_without_target_is_the_end_to_end_comparison(argv, handler):
    args = build_parser().parse_args(argv)
    assert args.func.__name__ == handler
    if handler == "_bench_e2e":
        assert args.json == ("--json" in argv) and args.load == 0.5 and args.low_rate == 5.0
    if argv[1] == "features":
        assert args.posts == 5 and args.workers == 1  # the target's own defaults win over bench's


def test_bench_help_explains_the_three_paths(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["bench", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for word in ("pipeline", "seed", "ceiling", "padded to 128", "pipeline/seed", "pipeline/ceiling", "model",
                 "features", "--markdown", "--low-rate", "sorted ceiling", "capacity"):
        assert word in out, word


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


def test_ratios_and_targets():
    assert ratio(30.0, 12.0) == 2.5 and ratio(None, 2.0) is None and ratio(1.0, 0.0) is None
    t = targets({"worker_cpu_ms_per_post": 1.0, "broker_cpu_ms_per_post": 1.6, "pipeline_over_sorted_ceiling": 0.95,
                 "low_rate_p50_ms": 49.0, "low_rate_p99_ms": 151.0})
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


def test_bench_posts_give_the_same_texts_under_another_run_id():
    texts = [{"text": f"ham text number {i}", "label": "ham"} for i in range(30)] + \
            [{"text": f"WIN cash now {i}", "label": "spam"} for i in range(10)]
    a = bench_posts(texts, 50, "run-a")
    b = bench_posts(texts, 50, "run-b")
    assert len(a) == len(b) == 50 and all(ev.kind == "post" for ev in a)
    assert [ev.payload["text"] for ev in a] == [ev.payload["text"] for ev in b]
    assert all(ev.payload["post_id"].startswith("run-a-") for ev in a)
    assert not {ev.payload["post_id"] for ev in a} & {ev.payload["post_id"] for ev in b}


def test_group_cpu_seconds_of_our_own_group():
    sum(i * i for i in range(300_000))  # some CPU time in this process
    cpu = group_cpu_seconds({"us": os.getpgid(0), "nobody": 0})
    assert cpu["us"] > 0 and cpu["nobody"] == 0
