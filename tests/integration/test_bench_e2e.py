"""`modpipe bench` end to end on a tiny load: real broker, real Triton, a real worker process.

Not a timed test: it checks that the three paths run on the same texts and that the report's fields
are present, positive and consistent with each other, never how fast anything is.
"""

from __future__ import annotations

import orjson
import pytest
from modpipe.loadgen.bench.report import TARGETS, format_markdown, format_text, write_markdown
from modpipe.loadgen.bench.runs import run

pytestmark = pytest.mark.integration

POSTS = 40
BASELINE = 30  # the seed and the ceilings on the first 30 posts (--baseline-posts)
LOAD_RATE = 15.0  # the load pass at a fixed rate (the default, 50% of saturation: test_loadgen_bench_report)


def test_bench_reports_three_paths_and_consistent_ratios(pipeline_settings, tmp_path):
    report = run(pipeline_settings, n_posts=POSTS, workers=1, ceiling_batch_sizes=(8, 16), warmup_posts=5,
                 load_rate=LOAD_RATE, low_rate=20.0, low_posts=20, timeout_s=120, progress=False, idle_s=1.0, untrimmed_texts=8,
                 baseline_posts=BASELINE, profile_dir=tmp_path / "profile")
    orjson.dumps(report)

    pipe, seed, ceil = report["pipeline"], report["seed"], report["ceiling"]
    sat, lat, low, cached = pipe["saturation"], pipe["latency"], pipe["low_rate"], pipe["saturation_text_cache"]
    # every path ran on every post, each rate positive
    assert sat["posts"] == lat["posts"] == cached["posts"] == POSTS and low["posts"] == 20
    assert seed["texts"] == report["config"]["baseline_posts"] == BASELINE
    assert report["texts"]["posts"] == POSTS and report["texts"]["tokens_mean"] > 0
    for rate in (pipe["posts_per_s"], seed["posts_per_s"], ceil["posts_per_s"], sat["posts_per_s_overall"],
                 lat["decided_posts_per_s"], seed["untrimmed_compute"]["posts_per_s"]):
        assert rate > 0
    assert pipe["posts_per_s"] == (sat["posts_per_s_steady"] or sat["posts_per_s_overall"])

    # the latency passes offered the configured rates; percentiles are ordered
    assert lat["offered_posts_per_s"] == LOAD_RATE and report["config"]["load_rate"] == LOAD_RATE
    assert lat["load"] == pytest.approx(LOAD_RATE / pipe["posts_per_s"], abs=0.001)
    assert low["offered_posts_per_s"] == 20.0
    for p in (lat, low):
        assert 0 < p["p50_ms"] <= p["p95_ms"] <= p["p99_ms"] <= p["max_ms"]
        # from the schedule (the headline) a post waited at least as long as from its produce() call
        for q in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms"):
            assert p[q] >= p["from_produce"][q] > 0, q
        assert p["producer_behind_max_s"] >= 0
    # the saturation pass computed every text (cache off); the last pass ran with the cache on
    assert sat["workers"]["text_cache_hit_ratio"] is None and cached["workers"]["text_cache_hit_ratio"] is not None
    assert cached["posts_per_s"] > 0 and 0 <= cached["workers"]["text_cache_hit_ratio"] <= 1
    # Triton computed at most the pass's texts (+ the re-warm-up post, whose count may land in the window)
    assert cached["triton"]["rows"] <= POSTS + 1

    # the seed: one request per post, batch 1 at the server too, padded to 128
    assert seed["batch"] == 1 and seed["width"] == 128
    assert seed["server"]["requests"] == BASELINE and seed["server"]["avg_server_batch"] == 1.0
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

    # py-spy sampled the worker through the saturation pass: the loop's work, the raw stacks kept
    prof = sat["profile"]["worker-0"]
    assert "error" not in prof, prof
    # (a 40-post pass keeps the loop busy for a few of its 100 Hz samples, or none: only the wiring is checked)
    assert prof["samples"] >= prof["main_thread_busy_samples"] >= 0
    assert bool(prof["top"]) == (prof["main_thread_busy_samples"] > 0)
    assert (tmp_path / "profile" / "worker-0.txt").exists() and report["config"]["profile_dir"]
    assert "profile" not in cached  # the pass with the text cache on is not profiled

    # the pipeline really went through Triton, in batches
    assert sat["triton"]["rows"] == POSTS and sat["workers"]["batches"] >= 1
    # each latency pass says what Triton did in it: every post of the pass computed there (text cache off)
    for p in (low, lat):
        assert p["triton"]["rows"] == p["posts"] and p["triton"]["requests"] >= 1
    # and what the feature tables' changelogs took: every pass changed user and post states
    for p in (sat, low, lat):
        assert p["workers"]["state_written_bytes"]["user"] > 0 and p["workers"]["state_written_bytes"]["post"] > 0
    assert sat["cpu_ms_per_post"]["workers"] > 0
    # the test's broker is not the stack's own: nothing of it was deleted between the passes
    assert all(p["broker_data_mb"] is None for p in (sat, low, lat, cached)) and not report["config"]["keep_records"]

    # ratios are the quotients of the reported rates; targets carry the measured values
    r = report["ratios"]
    assert r["pipeline_over_seed"] == pytest.approx(pipe["posts_per_s"] / seed["posts_per_s"], abs=1e-3)
    assert r["pipeline_over_ceiling"] == pytest.approx(pipe["posts_per_s"] / ceil["posts_per_s"], abs=1e-3)
    t = report["targets"]
    assert set(t) == set(TARGETS)
    assert t["pipeline_over_sorted_ceiling"]["value"] == r["pipeline_over_sorted_ceiling"]
    assert t["worker_cpu_ms_per_post"]["value"] == sat["cpu_ms_per_post"]["workers"]
    assert t["low_rate_p99_ms"]["value"] == low["p99_ms"] and t["load_p99_ms"]["value"] == lat["p99_ms"]
    assert t["load_p99_ms"]["load_share"] == lat["load"]
    for name, (direction, goal) in TARGETS.items():
        value = t[name]["value"]  # the broker's CPU is None here: the test's broker is not the stack's own
        met = value is not None and (value <= goal if direction == "max" else value >= goal)
        if name == "load_p99_ms":
            met = met and lat["load"] >= 0.495
        assert t[name]["met"] == met
    assert report["all_targets_met"] == all(x["met"] for x in t.values())
    assert report["capacity"]["posts_per_worker_core_s"] == pytest.approx(1000 / sat["cpu_ms_per_post"]["workers"],
                                                                         rel=0.01)

    m = report["machine"]
    assert m["cpu_count"] >= 1 and m["gpu"] is None and isinstance(m["shared"], bool)
    assert set(m["other_cores_by_phase"]) == {"pipeline_saturation", "pipeline_low_rate", "pipeline_latency",
                                             "pipeline_text_cache", "seed", "ceiling"}
    assert report["model"]["served_by_triton"]["build_version"] == report["model"]["build_version"]

    table = format_markdown(report)
    for needle in ("**pipeline**", "**seed**", "**ceiling**", "pipeline / seed", "pipeline / ceiling",
                   "pipeline / sorted ceiling", "Capacity", "text cache on", "(fixed rate)",
                   f"p99 at {LOAD_RATE:g} posts/s = ", f"(the first {BASELINE} posts)"):
        assert needle in table
    assert f"{r['pipeline_over_seed']:,.2f}" in table  # the table's number format (1,234.56)
    text = format_text(report)
    assert "targets" in text and f"s of model time for {POSTS} texts" in text  # the run's machine speed
    assert "worker-0 event loop (py-spy" in text
    assert text.count("KB of feature-table states written a post") == 3  # saturation and both latency passes
    assert text.count("ms computing; model busy") == 2  # both latency passes split Triton's queue from compute
    assert table.count("from produce(): ") == 2 and text.count("s behind its schedule)") == 2
    path = write_markdown(report, tmp_path / "bench.md")
    assert "| pipeline / sorted ceiling (text model on CPU) |" in path.read_text()
    # the run cleaned up after itself
    assert not list((pipeline_settings.state_dir / "bench").glob("e2e-*"))


def test_release_deletes_only_what_was_committed_and_read(bootstrap, tmp_path):
    """Between passes the bench deletes the posts the group committed and the decisions it read; nothing
    past them, and never a changelog (the tables' state)."""
    from confluent_kafka import Consumer, Producer, TopicPartition
    from modpipe.loadgen.bench.pipeline import release_consumed
    from modpipe.streams.moderation.topics import TopicNames, ensure_topics

    from modpipe.settings import Settings

    tag = tmp_path.name[-8:].replace("-", "_")
    settings = Settings.from_env(state_dir=tmp_path / "state", bootstrap_servers=bootstrap, topic_prefix=f"r{tag}.",
                                 app_id=f"modpipe-release-{tag}")
    ensure_topics(settings, bootstrap)
    names = TopicNames.from_settings(settings)
    changelog = next(iter(names.changelogs.values()))
    producer = Producer({"bootstrap.servers": bootstrap})
    for topic in (names.posts, names.decisions, changelog):
        for i in range(6):
            producer.produce(topic, value=b"{}", key=str(i).encode(), partition=0)
    assert producer.flush(30) == 0
    group = Consumer({"bootstrap.servers": bootstrap, "group.id": settings.app_id, "enable.auto.commit": False,
                      "isolation.level": "read_committed"})
    group.commit(offsets=[TopicPartition(names.posts, 0, 4)], asynchronous=False)  # the workers committed 4
    group.close()
    data = tmp_path / "broker-data"
    data.mkdir()
    (data / "kafka.json").write_bytes(b"x" * 250_000)
    held = release_consumed(settings, bootstrap, names.posts, {names.decisions: {0: 2, 1: 0}}, data)
    assert held == 0.2

    def lows(topic: str) -> list[int]:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks", "isolation.level": "read_committed"})
        try:
            return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[0] for p in range(settings.partitions)]
        finally:
            c.close()
    assert lows(names.posts) == [4] + [0] * (settings.partitions - 1)
    assert lows(names.decisions) == [2] + [0] * (settings.partitions - 1)
    assert lows(changelog) == [0] * settings.partitions
