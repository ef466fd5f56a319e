"""Purging the internal topics behind the commits (streams/runtime/purge.py), on the real broker and worker: the stage
topics lose the records the group has committed, never one it has not; the platform's topics and the changelogs
keep everything; a worker SIGKILLed after a purge restores its tables and goes on, deciding each post once."""

from __future__ import annotations

import pytest
from modpipe.loadgen.chaos import compare_tables, count_decisions, offline_tables, streaming_tables
from modpipe.streams.local.stack import LocalStack

from tests.fixtures.waiting import wait_for
from tests.integration.test_commit_stall import decisions, offsets, posts_round, produce_plainly, wait_decided

pytestmark = pytest.mark.integration

PURGE_MS = 300


def purged_partitions(stack: LocalStack) -> float:
    return sum(v for k, v in LocalStack.scrape_worker(stack.workers[0]).items()
               if k.startswith("modpipe_internal_purges_total") and 'outcome=ok' in k)


def internal_marks(settings, stack: LocalStack) -> dict[tuple[str, int], tuple[int, int, int]]:
    return {(topic, p): mark for topic in stack.topics.stages.values()
            for p, mark in offsets(settings, stack.bootstrap, topic).items()}


def test_committed_stage_records_are_purged_and_nothing_else(local_stack, pipeline_settings):
    settings = pipeline_settings
    # every hop through its stage topic, so the stage topics carry records to purge
    stack = local_stack(workers=1, modpipe_text_model="off", modpipe_local_hops="off",
                        modpipe_purge_interval_ms=str(PURGE_MS))
    first = posts_round("purge-a", 60)
    produce_plainly(stack.bootstrap, stack.topics.posts, first)
    wait_decided(stack, settings, {p["post_id"] for p in first})

    def purged_to_committed() -> bool:
        marks = internal_marks(settings, stack)
        # a purge runs after a checkpoint: the last one's offsets wait for the next, so feed one more post
        tick = posts_round(f"purge-tick-{len(ticks)}", 1)
        produce_plainly(stack.bootstrap, stack.topics.posts, tick)
        ticks.append(tick)
        return sum(low for _, low, _ in marks.values()) > 0 and purged_partitions(stack) > 0
    ticks: list = []
    wait_for(purged_to_committed, 30, "stage records purged", interval=PURGE_MS / 1000 * 3)
    marks = internal_marks(settings, stack)
    report = {"stage partitions (committed, log start, end)": {f"{t}[{p}]": m for (t, p), m in marks.items()},
              "purged partitions (metric)": purged_partitions(stack)}
    print("purge report:", report)
    # never past what the group committed: nothing still to be read is gone
    assert all(low <= committed for committed, low, _ in marks.values() if committed >= 0), report
    assert all(low == 0 for committed, low, _ in marks.values() if committed < 0), report
    # the platform's topics and the changelogs are never touched
    untouched = [stack.topics.posts, stack.topics.decisions, *stack.topics.changelogs.values()]
    lows = {t: [low for _, low, _ in offsets(settings, stack.bootstrap, t).values()] for t in untouched}
    assert all(low == 0 for ls in lows.values() for low in ls), lows

    # a worker killed after the purge restores from the changelogs, not the purged stage topics, and goes on
    stack.workers[0].process.kill()
    stack.start_worker(0)
    stack.wait_workers_ready()
    second = posts_round("purge-b", 40)
    produce_plainly(stack.bootstrap, stack.topics.posts, second)
    wait_decided(stack, settings, {p["post_id"] for p in second})
    sent = first + second + [p for tick in ticks for p in tick]
    wait_decided(stack, settings, {p["post_id"] for p in sent})
    made = decisions(settings, stack.bootstrap, stack.topics.decisions)
    counts = count_decisions(made, {p["post_id"] for p in sent})
    assert counts["lost"] == 0 and counts["duplicate_decisions"] == 0, counts
    # every table as modpipe.features.offline computes it from the same posts and decisions
    tables = compare_tables(streaming_tables(settings, stack.bootstrap),
                            offline_tables([("post", p) for p in sent], made, {p["post_id"]: p for p in sent}))
    assert tables["equal"], tables
