"""The load generator on the real stack: real broker, real Triton, real worker processes."""

from __future__ import annotations

import time

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from modpipe.loadgen.cli import run_loadgen
from modpipe.loadgen.measure import format_table
from modpipe.simulation.simulator import TRUTH_HEADER

pytestmark = pytest.mark.integration


def test_small_load_is_fully_decided_and_reported(local_stack, pipeline_settings, model_build):
    stack = local_stack(workers=1)
    report = run_loadgen(pipeline_settings, stack.bootstrap, rate=50, count=100, pattern="constant",
                         scenario="mixed", seed=1, timeout_s=120, progress=False, lag_interval_s=0.5,
                         texts=model_build.heldout(), run_id="itest",
                         healthy=lambda: all(w.process.alive() for w in stack.workers))
    assert report["sent"]["posts"] == 100 and report["sent"]["delivery_errors"] == 0
    assert report["decided"] == 100 and report["lost"] == 0, "posts without a decision"
    lat = report["latency_ms"]
    assert 0 < lat["p50_ms"] <= lat["p95_ms"] <= lat["p99_ms"] <= lat["max_ms"] < 120_000
    # from each post's schedule (the headline) a post waited at least as long as from its produce() call
    produced = report["latency_from_produce_ms"]
    assert lat["n"] == produced["n"] == 100
    for q in ("p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms"):
        assert lat[q] >= produced[q] > 0, q
    assert "from its produce() call" in format_table(report)
    th = report["throughput"]
    assert th["produce_posts_per_s"] > 0 and th["decisions_per_s"] > 0
    for view in ("review_or_block", "block"):
        m = report["accuracy"][view]
        assert m["tp"] + m["fp"] + m["fn"] + m["tn"] == 100
        for k in ("precision", "recall", "f1", "accuracy", "false_positive_rate"):
            assert m[k] is None or 0.0 <= m[k] <= 1.0, (view, k, m[k])
    confusion = report["accuracy"]["confusion"]
    assert sum(sum(row.values()) for row in confusion.values()) == 100
    assert report["accuracy"]["truth"]["spam"] > 0  # the mixed scenario sent spam
    assert {"actor=legit", "actor=spammer"} <= set(report["breakdown"])
    assert report["lag"]["samples"] and report["lag"]["max"] >= 0
    assert sum(r["decided"] for r in report["timeseries"]) == 100
    assert "review_or_block" in format_table(report)
    orjson.dumps(report)

    # side streams went to their own topics (created with the posts partition count) with truth headers
    topics = AdminClient({"bootstrap.servers": stack.bootstrap}).list_topics(timeout=10).topics
    posts_partitions = len(topics[pipeline_settings.topic("posts")].partitions)
    for name in ("reports", "engagements", "labels", "bans"):
        assert len(topics[pipeline_settings.topic(name)].partitions) == posts_partitions
    assert report["sent"]["events"].get("engagement", 0) > 0
    consumer = Consumer({**pipeline_settings.kafka_consumer_config(), "bootstrap.servers": stack.bootstrap,
                         "group.id": "loadgen-itest-check",
                         "enable.auto.commit": False})
    try:
        topic = pipeline_settings.topic("engagements")
        consumer.assign([TopicPartition(topic, p, 0) for p in range(posts_partitions)])
        got, deadline = [], time.monotonic() + 20
        while len(got) < report["sent"]["events"]["engagement"] and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                got.append(msg)
        assert len(got) == report["sent"]["events"]["engagement"]
        for msg in got:
            truth = orjson.loads(dict(msg.headers())[TRUTH_HEADER])
            assert "is_spam" in truth and b"is_spam" not in msg.value()
            assert msg.key() == orjson.loads(msg.value())["post_id"].encode()
    finally:
        consumer.close()
