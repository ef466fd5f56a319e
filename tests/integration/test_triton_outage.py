"""A worker through a Triton outage (issue #14): it keeps the posts it cannot score uncommitted, stops on
SIGTERM while it retries, and after Triton comes back every post is decided exactly once."""

from __future__ import annotations

import dataclasses
import time

import pytest

from loadgen.smoke import end_consumer
from modpipe.services.process import free_port
from modpipe.serving.server import TritonServer
from streams.stack import LocalStack
from tests.integration.test_streaming import collect_decisions, produce_posts

pytestmark = pytest.mark.integration


def test_worker_waits_out_a_triton_outage_stops_on_sigterm_and_loses_nothing(pipeline_settings, model_build,
                                                                             tmp_path):
    triton = TritonServer(dataclasses.replace(pipeline_settings, state_dir=tmp_path / "triton"), model_build,
                          http_port=free_port(), grpc_port=free_port(), metrics_port=free_port()).start(timeout=180)
    settings = dataclasses.replace(pipeline_settings, triton_url=triton.grpc_url)
    stack = LocalStack(settings, workers=1).start()
    try:
        consumer = end_consumer(settings, stack.bootstrap, [stack.topics.decisions])
        first = produce_posts(settings, 20, "before", model_build.heldout())
        assert set(collect_decisions(consumer, set(first), 120)) == set(first)

        triton.process.kill()  # SIGKILL, as the user did
        triton.stop()
        during = produce_posts(settings, 30, "outage", model_build.heldout())
        log = stack.workers[0].process.log_path
        deadline = time.monotonic() + 60
        while "triton request failed; retrying" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, "the worker never tried Triton for the new posts"
            time.sleep(0.5)
        assert not collect_decisions(consumer, set(during), 3), "decided without the text model while it waits"

        t0 = time.monotonic()
        rc = stack.workers[0].process.stop(timeout=30)  # SIGTERM, SIGKILL only after 30 s
        stopped_in = time.monotonic() - t0
        print(f"worker stopped {stopped_in:.1f} s after SIGTERM")
        assert stopped_in < 20, f"the worker took {stopped_in:.1f} s to stop on SIGTERM while retrying Triton"
        assert rc == 0, f"exit code {rc} on SIGTERM; log:\n{stack.workers[0].process.tail(30)}"

        triton.start(timeout=180)  # the same ports: the worker's TRITON_URL is unchanged
        stack.start_worker(0)
        got = collect_decisions(consumer, set(during), 180)
        consumer.close()
        assert set(got) == set(during), f"{len(set(during) - set(got))} posts lost across the outage"
        assert all(len(v) == 1 for v in got.values()), "a post was decided twice"
    finally:
        stack.stop()
        triton.stop()
