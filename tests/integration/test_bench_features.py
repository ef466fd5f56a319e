"""`modpipe bench features` on a small load: the feature path (text model off) on a real broker and a real
worker process, with and without the Kafka hop between stages, beside a plain consume/produce loop.

Not a timed test: it checks that the report's fields are present, positive and consistent, never how fast
anything is."""

from __future__ import annotations

import orjson
import pytest
from modpipe.loadgen import bench_features

pytestmark = pytest.mark.integration

POSTS = 300


def test_bench_features_reports_both_paths_and_what_the_changelogs_cost(pipeline_settings):
    report = bench_features.run(pipeline_settings, n_posts=POSTS, workers=1, progress=False)
    orjson.dumps(report)

    assert report["posts"] == POSTS and report["plain_loop_posts_per_s"] > 0
    for mode in (report["local_hops"], report["every_hop_through_kafka"]):
        assert mode["posts_per_s"] > 0 and mode["worker_cpu_ms_per_post"] > 0
        # every post changed its user's, its ip's and its own state: each table's changelog got bytes, and a
        # user state (counts, capped histories) is larger than a post's id alone
        per_post = mode["state_bytes_per_post"]
        assert {"user", "ip", "post"} <= set(per_post)
        assert per_post["user"] > 50 and per_post["post"] > 50
    # the broker is the test's shared one, not the bench's own: its CPU is not attributed
    assert report["broker_cpu_ms_per_post"] is None
    t = report["targets"]
    assert t["worker_cpu_ms_per_post"]["value"] == report["worker_cpu_ms_per_post"]
    assert t["posts_per_s_per_worker"]["met"] == (report["feature_path_posts_per_s"] >= 1000)
