"""`modpipe bench` end to end on a tiny load: real broker, real Triton, a real worker process.

Not a timed test: it checks that the three paths run on the same texts and that the report's fields
are present, positive and consistent with each other, never how fast anything is.
"""

from __future__ import annotations

import orjson
import pytest

from loadgen.bench import TARGETS, format_markdown, format_text, run, write_markdown

pytestmark = pytest.mark.integration

POSTS = 40


def test_bench_reports_three_paths_and_consistent_ratios(pipeline_settings, tmp_path):
    report = run(pipeline_settings, n_posts=POSTS, workers=1, ceiling_batch_sizes=(8, 16), warmup_posts=5,
                 timeout_s=120, progress=False, idle_s=1.0, untrimmed_texts=8)
    orjson.dumps(report)

    pipe, seed, ceil = report["pipeline"], report["seed"], report["ceiling"]
    sat, lat = pipe["saturation"], pipe["latency"]
    # every path ran on every post, each rate positive
    assert sat["posts"] == lat["posts"] == seed["texts"] == POSTS
    assert report["texts"]["posts"] == POSTS and report["texts"]["tokens_mean"] > 0
    for rate in (pipe["posts_per_s"], seed["posts_per_s"], ceil["posts_per_s"], sat["posts_per_s_overall"],
                 lat["decided_posts_per_s"], seed["untrimmed_compute"]["posts_per_s"]):
        assert rate > 0
    assert pipe["posts_per_s"] == (sat["posts_per_s_steady"] or sat["posts_per_s_overall"])

    # the latency pass offered the configured share of the saturation rate; percentiles are ordered
    assert lat["offered_posts_per_s"] == pytest.approx(0.7 * pipe["posts_per_s"], abs=0.01)
    assert 0 < lat["p50_ms"] <= lat["p95_ms"] <= lat["p99_ms"] <= lat["max_ms"]

    # the seed: one request per post, batch 1 at the server too, padded to 128
    assert seed["batch"] == 1 and seed["width"] == 128
    assert seed["server"]["requests"] == POSTS and seed["server"]["avg_server_batch"] == 1.0
    assert 0 < seed["p50_ms"] <= seed["p99_ms"]

    # the ceiling: the best of the batch sizes tried
    assert [r["batch"] for r in ceil["by_batch"]] == [8, 16]
    assert ceil["posts_per_s"] == max(r["posts_per_s"] for r in ceil["by_batch"])
    assert ceil["best_batch"] in (8, 16) and ceil["threads"] >= 1
    # the sorted ceiling ran the same texts, sorted by length: no batch is wider than the arrival-order one
    srt = report["ceiling_sorted"]
    assert [r["batch"] for r in srt["by_batch"]] == [8, 16]
    for a, b in zip(srt["by_batch"], ceil["by_batch"], strict=True):
        assert a["mean_width"] <= b["mean_width"]

    # the pipeline really went through Triton, in batches
    assert sat["triton"]["rows"] == POSTS and sat["workers"]["batches"] >= 1
    assert sat["cpu_ms_per_post"]["workers"] > 0

    # ratios are the quotients of the reported rates; targets say whether they are met
    r = report["ratios"]
    assert r["pipeline_over_seed"] == pytest.approx(pipe["posts_per_s"] / seed["posts_per_s"], abs=1e-3)
    assert r["pipeline_over_ceiling"] == pytest.approx(pipe["posts_per_s"] / ceil["posts_per_s"], abs=1e-3)
    for name, goal in TARGETS.items():
        t = report["targets"][name]
        assert t["target"] == goal and t["value"] == r[name] and t["met"] == (r[name] >= goal)
    assert report["all_targets_met"] == all(t["met"] for t in report["targets"].values())

    m = report["machine"]
    assert m["cpu_count"] >= 1 and m["gpu"] is None and isinstance(m["shared"], bool)
    assert set(m["other_cores_by_phase"]) == {"pipeline_saturation", "pipeline_latency", "seed", "ceiling"}
    assert report["model"]["served_by_triton"]["build_version"] == report["model"]["build_version"]

    table = format_markdown(report)
    for needle in ("**pipeline**", "**seed**", "**ceiling**", "pipeline / seed", "pipeline / ceiling"):
        assert needle in table
    assert f"{r['pipeline_over_seed']:.2f}" in table
    assert "targets" in format_text(report)
    path = write_markdown(report, tmp_path / "bench.md")
    assert "| pipeline / ceiling |" in path.read_text()
    # the run cleaned up after itself
    assert not list((pipeline_settings.state_dir / "bench").glob("e2e-*"))
