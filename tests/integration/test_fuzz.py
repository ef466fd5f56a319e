"""Hostile input (issue #14): 10,000 generated records into every input topic of a live worker. Each ends in the
dead-letter topic with its reason or is processed; the worker stays up; its memory stays bounded."""

from __future__ import annotations

import pytest
from modpipe.loadgen.fuzz import run_fuzz, worker_rss_mib

pytestmark = pytest.mark.integration


def test_ten_thousand_hostile_records_each_end_where_they_should(local_stack, pipeline_settings):
    stack = local_stack(workers=1)
    rss_before = worker_rss_mib(stack.workers[0].process.pid)
    report = run_fuzz(pipeline_settings, stack.bootstrap, 10_000, seed=1, timeout_s=300, progress=False,
                      healthy=stack.workers[0].process.alive)
    detail = str(report)
    assert stack.workers[0].process.alive(), f"the worker died; log:\n{stack.workers[0].process.tail(40)}"
    assert report["records"] == 10_000 and sum(report["sent"].values()) == 10_000
    assert report["dead_letters_expected"] > 5_000 and report["valid_posts"] > 100, detail  # both kinds exercised
    assert len(report["dead_letters"]) >= 6, detail  # many different reasons
    assert report["lost"] == 0, detail
    assert report["dead_letter_reason_mismatches"] == 0 and report["valid_records_dead_lettered"] == 0, detail
    rss_after = worker_rss_mib(stack.workers[0].process.pid)
    assert rss_after < rss_before + 400, f"worker memory {rss_before} -> {rss_after} MiB"
