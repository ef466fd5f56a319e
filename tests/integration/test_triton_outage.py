"""Workers through a Triton outage. Policy `wait`: the posts they cannot score are carried across checkpoints as
state (no transaction waits for Triton), they hand them over in rebalances and stop on SIGTERM while they retry,
and after Triton comes back every post is decided exactly once. Policy `decide`: after MODPIPE_TEXT_MODEL_OUTAGE_S
it decides without the text model (degraded), and decides those posts again with it (revision 2) once Triton is
back."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime

import orjson
import pytest
from modpipe.loadgen.smoke import end_consumer
from modpipe.streams.local.stack import LocalStack

from modpipe.services.process import free_port
from modpipe.serving.server import TritonServer
from tests.integration.test_streaming import collect_decisions, produce_posts

pytestmark = pytest.mark.integration


def private_triton(settings, model_build, tmp_path) -> TritonServer:
    """A Triton of the test's own (the session's is shared by other tests: not ours to kill)."""
    return TritonServer(dataclasses.replace(settings, state_dir=tmp_path / "triton"), model_build,
                        http_port=free_port(), grpc_port=free_port(), metrics_port=free_port()).start(timeout=180)


def test_a_triton_outage_holds_no_transaction_restarts_nothing_and_loses_nothing(pipeline_settings, model_build,
                                                                                  tmp_path):
    """Policy `wait`, an outage three times the transaction timeout: the posts that reach the worker meanwhile are
    carried across checkpoints as state (their input offsets committed), a worker that joins and one that stops on
    SIGTERM hand them over without waiting for Triton, no worker fails, and once Triton is back each is decided
    once, with the text model."""
    triton = private_triton(pipeline_settings, model_build, tmp_path)
    settings = dataclasses.replace(pipeline_settings, triton_url=triton.grpc_url, text_model_outage_policy="wait",
                                   transaction_timeout_ms=6_000, checkpoint_model_wait_ms=500)
    stack = LocalStack(settings, workers=1).start()
    try:
        consumer = end_consumer(settings, stack.bootstrap, [stack.topics.decisions])
        first = produce_posts(settings, 20, "before", model_build.heldout())
        assert set(collect_decisions(consumer, set(first), 120)) == set(first)

        triton.process.kill()  # SIGKILL, as the user did
        triton.stop()
        out_at = time.monotonic()
        during = produce_posts(settings, 30, "outage", model_build.heldout())
        log = stack.workers[0].process.log_path
        deadline = time.monotonic() + 60
        while "triton request failed; retrying" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, "the worker never tried Triton for the new posts"
            time.sleep(0.5)
        # the posts wait as state, not in an open transaction: their input offsets are committed
        deadline = time.monotonic() + 30
        while stack.group_lag() != 0:
            assert time.monotonic() < deadline, f"input still uncommitted during the outage: lag {stack.group_lag()}"
            time.sleep(0.5)
        assert stack.scrape().get("modpipe_posts_carried_total", 0) >= len(during)

        # a worker joins during the outage (its warm-up gives Triton MODPIPE_WARM_UP_TIMEOUT_S first): the
        # rebalance, the revocation's checkpoints included, waits for no Triton
        stack.extra_env["MODPIPE_WARM_UP_TIMEOUT_S"] = "3"
        stack.start_worker(1)
        wanted = len(stack.topics.inputs()) * settings.partitions
        deadline = time.monotonic() + 120
        while not (stack.assigned_partitions() == wanted and sum(
                v for k, v in stack.scrape_worker(stack.workers[1]).items()
                if k.startswith("modpipe_assigned_partitions")) > 0):
            assert time.monotonic() < deadline, "the group did not finish its rebalance during the outage"
            time.sleep(0.2)
        events = [orjson.loads(line) for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]
        revoked = next(e for e in events if e["msg"] == "partitions revoked")
        assigned = next(e for e in events if e["msg"] == "partitions assigned" and e["ts"] > revoked["ts"])
        handed = next(e for e in events if e["msg"].startswith("posts waiting for the text model handed over"))
        took = (datetime.fromisoformat(assigned["ts"]) - datetime.fromisoformat(revoked["ts"])).total_seconds()
        print(f"rebalance during the outage: revoked to assigned again in {took:.2f} s, {handed['posts']} posts "
              "handed over")
        assert took < 10, f"the first worker spent {took:.1f} s from its revocation to its next assignment"

        while time.monotonic() < out_at + 3 * settings.transaction_timeout_ms / 1000:
            time.sleep(0.5)
        assert not collect_decisions(consumer, set(during), 2), "decided without the text model while it waits"
        for w in stack.workers:
            assert w.process.alive(), f"{w.name} exited during the outage:\n{w.process.tail(30)}"
            assert "worker stops after a failure" not in w.process.log_path.read_text(errors="replace"), w.name

        t0 = time.monotonic()
        rc = stack.workers[0].stop(timeout=30)  # SIGTERM, SIGKILL only after 30 s
        stopped_in = time.monotonic() - t0
        print(f"worker stopped {stopped_in:.1f} s after SIGTERM")
        assert stopped_in < 20, f"the worker took {stopped_in:.1f} s to stop on SIGTERM while retrying Triton"
        assert rc == 143, f"exit code {rc} on SIGTERM (a clean stop: 128 + 15); log:\n{stack.workers[0].process.tail(30)}"

        triton.start(timeout=180)  # the same ports: the worker's TRITON_URL is unchanged
        back_at = time.monotonic()
        got = collect_decisions(consumer, set(during), 180)
        print(f"every post of the outage decided {time.monotonic() - back_at:.1f} s after Triton was ready again")
        consumer.close()
        assert set(got) == set(during), f"{len(set(during) - set(got))} posts lost across the outage"
        # Exactly once: each carried post is decided by whichever worker holds its partition when Triton answers
        # (a read_committed reader sees one record), with the text model.
        for pid, decisions in got.items():
            assert len(decisions) == 1, f"{pid} decided {len(decisions)} times: {[r['revision'] for _, r in decisions]}"
            record = decisions[0][1]
            assert record["revision"] == 1 and record["degraded"] is False
        assert stack.workers[1].process.alive()
    finally:
        stack.stop()
        triton.stop()


def test_after_the_outage_limit_posts_are_decided_degraded_then_again_with_the_text_model(pipeline_settings,
                                                                                         model_build, tmp_path):
    triton = private_triton(pipeline_settings, model_build, tmp_path)
    settings = dataclasses.replace(pipeline_settings, triton_url=triton.grpc_url, text_model_outage_policy="decide",
                                   text_model_outage_s=2.0)
    stack = LocalStack(settings, workers=1).start()
    try:
        consumer = end_consumer(settings, stack.bootstrap, [stack.topics.decisions])
        warm = produce_posts(settings, 5, "warm", model_build.heldout())
        assert set(collect_decisions(consumer, set(warm), 120)) == set(warm)
        triton.process.kill()
        triton.stop()
        during = produce_posts(settings, 20, "outage", model_build.heldout())
        first = collect_decisions(consumer, set(during), 90)
        assert set(first) == set(during), f"{len(set(during) - set(first))} posts undecided during the outage"
        for decisions in first.values():
            (_, record), = decisions
            assert record["degraded"] is True and record["text_probability"] is None and record["revision"] == 1
            assert "text model did not answer" in record["reasons"][0]["description"]
        triton.start(timeout=180)
        again: dict[str, dict] = {}
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and set(again) != set(during):
            for pid, decisions in collect_decisions(consumer, set(during), 1).items():
                for _, record in decisions:
                    if record["revision"] == 2:
                        again[pid] = record
        consumer.close()
        assert set(again) == set(during), f"{len(set(during) - set(again))} degraded posts not decided again"
        for record in again.values():
            assert record["degraded"] is False and record["text_probability"] is not None
        metrics = stack.scrape()
        assert metrics.get("modpipe_degraded_decisions_total{policy=decide}") == len(during)
        assert metrics.get("modpipe_redecisions_total{reason=text_model_back}") == len(during)
        assert metrics.get("modpipe_text_model_available") == 1
    finally:
        stack.stop()
        triton.stop()
