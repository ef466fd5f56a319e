"""modpipe.streams.metrics: the cgroup memory limit a worker exports beside its resident memory."""

from __future__ import annotations

import math

from modpipe.streams.metrics import cgroup_memory_limit


def test_cgroup_v2_limit_and_no_limit(tmp_path):
    (tmp_path / "memory.max").write_text("2147483648\n")
    assert cgroup_memory_limit(tmp_path) == 2 * 2**30
    (tmp_path / "memory.max").write_text("max\n")
    assert math.isinf(cgroup_memory_limit(tmp_path))


def test_cgroup_v1_limit_and_its_way_of_saying_none(tmp_path):
    (tmp_path / "memory").mkdir()
    limit = tmp_path / "memory" / "memory.limit_in_bytes"
    limit.write_text("3221225472\n")
    assert cgroup_memory_limit(tmp_path) == 3 * 2**30
    limit.write_text("9223372036854771712\n")  # what v1 reports without a limit
    assert math.isinf(cgroup_memory_limit(tmp_path))


def test_no_cgroup_files_or_nonsense_mean_no_limit(tmp_path):
    assert math.isinf(cgroup_memory_limit(tmp_path))
    (tmp_path / "memory.max").write_text("lots\n")
    assert math.isinf(cgroup_memory_limit(tmp_path))
