"""`modpipe bench state` on a small load: one worker process on a real broker, each post with a user, a link and
an IP address of its own, with RocksDB tables and in-memory ones. Not a timed test: it checks what the report
counts (the keys each table holds, before and after each restart, and what each restore read), never how fast.
"""

from __future__ import annotations

import uuid

import orjson
import pytest
from modpipe.loadgen import bench_state

from modpipe.services.process import free_port
from modpipe.settings import Settings

pytestmark = pytest.mark.integration

POSTS = 1000


def test_bench_state_counts_every_key_and_each_restore_brings_every_key_back(tmp_path, bootstrap):
    tag = uuid.uuid4().hex[:8]
    settings = Settings.from_env(state_dir=tmp_path / "state", bootstrap_servers=bootstrap, text_model="off",
                                 topic_prefix=f"t{tag}.", app_id=f"modpipe-test-{tag}", metrics_port=free_port(),
                                 log_format="json")
    report = bench_state.run(settings, POSTS, progress=False, timeout_s=300)
    orjson.dumps(report)
    expected = {"user": POSTS, "url": POSTS, "domain": POSTS // 100, "ip": POSTS, "post": POSTS}
    rocks, memory = report["passes"]["rocksdb"], report["passes"]["memory"]
    for p in (rocks, memory):
        assert p["keys"] == expected
        assert p["restore"]["keys"] == expected  # after a SIGKILL, every key is back
        assert p["posts_per_s"] > 0 and p["rss_mib"]["peak"] >= p["rss_mib"]["idle"] > 0
    total = sum(expected.values())
    # in memory, a restore reads the whole changelog: at least one record per key
    assert memory["restore"]["changelog_records_read"] >= total
    # RocksDB's stores hold what was committed: the restart reads only a tail, far less than the keys
    assert rocks["restore"]["changelog_records_read"] < total // 10
    # a new pod on an empty disk reads the whole changelog into new stores and ends with the same keys
    empty = rocks["restore_from_empty_disk"]
    assert empty["keys"] == expected and empty["changelog_records_read"] >= total
    assert rocks["disk_bytes"] > 0 and set(rocks["disk_bytes_per_key"]) == set(expected)
    assert report["worker_memory_mb"] == settings.worker_memory_mb
    assert report["targets"]["posts_per_s_over_memory"]["value"] > 0
