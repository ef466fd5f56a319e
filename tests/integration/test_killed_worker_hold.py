"""A worker SIGKILLed with its transaction open, and not restarted (its node lost, its pod not rescheduled yet):
the broker aborts that transaction after the producer's transaction.timeout.ms (MODPIPE_TRANSACTION_TIMEOUT_MS)
plus up to its abort check's interval (transaction.abort.timed.out.transaction.cleanup.interval.ms, 10 s by
default); until then every read_committed reader of what the worker wrote (the platform's decisions, the next
stage, the changelogs' restores) stands at the transaction's first record. With the defaults, at most 30 s."""

from __future__ import annotations

import signal
import time

import pytest
from modpipe.features.events import TABLES
from modpipe.loadgen.chaos import changelog_topic, held_back
from modpipe.streams.local.stack import LocalStack

from tests.fixtures.waiting import wait_for
from tests.integration.test_zombie import Flow, decided

pytestmark = pytest.mark.integration

HOLD_TARGET_S = 30.0  # what a dead worker may cost read_committed readers, with the defaults on a stock broker
ABORT_CHECK_S = 10.0  # transaction.abort.timed.out.transaction.cleanup.interval.ms, Apache Kafka's default
READER_S = 1.0  # the polling reader's own lag: a look every 0.5 s, each a request to every partition
TRIES = 50  # a worker with posts flowing has a transaction open most of the time: a few freezes find one


def test_a_killed_workers_open_transaction_holds_readers_at_most_30_s(pipeline_settings, model_build):
    settings = pipeline_settings
    timeout_s = settings.transaction_timeout_ms / 1000
    assert timeout_s + ABORT_CHECK_S <= HOLD_TARGET_S, "the default transaction timeout allows a longer hold"
    stack = LocalStack(settings, workers=1).start()
    flow = None
    try:
        topics = [stack.topics.decisions, stack.topics.awaiting_text, *stack.topics.stages.values(),
                  *(changelog_topic(settings, t) for t in TABLES)]
        flow = Flow(settings, stack.bootstrap, model_build.heldout())
        flow.start()
        wait_for(lambda: len(decided(settings, stack.bootstrap, stack.topics.decisions)) >= 20, 90,
                 "decisions before the kill")
        worker = stack.workers[0].process
        # freeze the worker (SIGSTOP) until a freeze finds its transaction open (a partition written to whose
        # last stable offset is behind its end), then SIGKILL it as it stands
        open_at = None
        for _ in range(TRIES):
            worker.signal(signal.SIGSTOP)
            open_at = held_back(settings, stack.bootstrap, topics)
            if open_at:
                break
            worker.signal(signal.SIGCONT)
            time.sleep(0.3)
        assert open_at, f"no freeze of {TRIES} found the worker's transaction open"
        worker.kill()
        killed = time.monotonic()
        flow.stop()
        wait_for(lambda: not held_back(settings, stack.bootstrap, topics), 120,
                 "the killed worker's transaction aborted", interval=0.5)
        held_s = time.monotonic() - killed
        print(f"open at the kill: {sorted(open_at)[:4]}; read_committed readers held {held_s:.1f} s after it "
              f"(transaction.timeout.ms {timeout_s:.0f} s)")
        assert held_s >= timeout_s - 2, "aborted before its timeout: not the timeout"
        assert held_s <= timeout_s + ABORT_CHECK_S + READER_S, f"readers held {held_s:.1f} s by a dead worker"
    finally:
        if flow is not None and flow.is_alive():
            flow.stop()
        stack.stop()
