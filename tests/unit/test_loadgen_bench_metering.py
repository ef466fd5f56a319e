"""CPU metering from /proc."""

from __future__ import annotations

import os

from modpipe.loadgen.bench.metering import group_cpu_seconds


def test_group_cpu_seconds_of_our_own_group():
    sum(i * i for i in range(300_000))  # some CPU time in this process
    cpu = group_cpu_seconds({"us": os.getpgid(0), "nobody": 0})
    assert cpu["us"] > 0 and cpu["nobody"] == 0
