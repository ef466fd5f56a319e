"""A round of posts through the real wiring (streams/moderation/agents.py) without Kafka: the per-item counters are
counted per round and added to the metrics once, at the round's end, with the same totals."""

from __future__ import annotations

import asyncio
import random

from modpipe.loadgen.posts import make_post
from modpipe.streams.kafka.records import TP, Record
from modpipe.streams.moderation import agents
from modpipe.streams.moderation.agents import Wiring, make_handlers
from modpipe.streams.moderation.app import create_pipeline
from modpipe.streams.moderation.bans import BanRegistry
from prometheus_client import REGISTRY

from modpipe import schema
from modpipe.decision.verdict import ThresholdDecider
from modpipe.settings import Settings
from tests.unit.test_text_model_outage import scorer


class Outbox:
    def __init__(self):
        self.topics: list[str] = []

    def produce(self, topic, value, *, key=None, partition=None, pending=None, **kwargs):
        self.topics.append(topic)
        if pending is not None:
            pending.hold()
            pending.release()


def local_hops() -> dict[str, float]:
    return {stage: REGISTRY.get_sample_value("modpipe_local_hops_total", {"stage": stage}) or 0.0
            for stage in ("user", "link", "ip", "post")}


def test_a_rounds_local_hops_reach_the_metrics_once_it_ends(monkeypatch):
    settings = Settings.from_env({"MODPIPE_TEXT_MODEL": "off"})
    pipe = create_pipeline(settings)
    s, _ = scorer("decide")
    wiring = Wiring(pipe, settings, s, ThresholdDecider(), BanRegistry(settings, "unused:0", "bans"), Outbox())
    wiring.assigned([TP(topic, p) for topic in pipe.topics.stages.values() for p in range(pipe.partitions)])
    ingest = make_handlers(wiring, settings, s, ThresholdDecider())[pipe.topics.posts]
    rng = random.Random(4)
    posts = [make_post(rng, f"round-{i}", "see you at lunch https://x.example/a", user_id=f"u{i % 3}")
             for i in range(10)]
    records = [Record(pipe.topics.posts, 0, i, None, schema.dumps(p), 1_700_000_000_000) for i, p in enumerate(posts)]

    seen_at_finish = []
    finish = wiring.finish

    def finish_and_look(r):
        seen_at_finish.append((dict(r.local_hops), local_hops()))
        finish(r)

    monkeypatch.setattr(wiring, "finish", finish_and_look)
    before = local_hops()

    async def round_():
        ingest(records)  # synchronous: the round ends before the batcher's task first runs
        queued = wiring.batcher.queued
        await wiring.batcher.close()
        return queued

    assert asyncio.run(round_()) == len(posts)  # every post reached the decision queue
    after = local_hops()
    (counted, at_finish), = seen_at_finish
    assert at_finish == before  # nothing added item by item
    assert set(counted) == {"user", "link", "ip", "post"} and all(counted.values())
    assert counted["post"] >= len(posts)
    assert {k: after[k] - before[k] for k in after} == counted
    assert agents.ROUND_MAX >= len(records)


def test_the_wiring_is_full_until_a_checkpoint_writes_the_states_or_commits_the_held_back_records():
    settings = Settings.from_env({"MODPIPE_TEXT_MODEL": "off"})
    pipe = create_pipeline(settings)
    s, _ = scorer("decide")
    outbox = Outbox()
    outbox.later_bytes = 0
    wiring = Wiring(pipe, settings, s, ThresholdDecider(), BanRegistry(settings, "unused:0", "bans"), outbox)
    wiring.assigned([TP(topic, p) for topic in pipe.topics.stages.values() for p in range(pipe.partitions)])
    ingest = make_handlers(wiring, settings, s, ThresholdDecider())[pipe.topics.posts]
    rng = random.Random(5)
    posts = [make_post(rng, f"full-{i}", "lunch?", user_id=f"u{i}") for i in range(10)]
    records = [Record(pipe.topics.posts, 0, i, None, schema.dumps(p), 1_700_000_000_000) for i, p in enumerate(posts)]
    assert wiring.budgets["checkpoint_states"] == wiring.states_max_bytes > 0

    async def scenario():
        ingest(records)
        used = sum(stage.batch_bytes for stage in wiring.stages.values())
        assert used > 0 and wiring.checkpoint_full is None  # 10 posts' states: far under the share
        wiring.states_max_bytes = used - 1
        assert wiring.checkpoint_full == "states"
        waiting = asyncio.ensure_future(wiring.checkpoint_room())
        await asyncio.sleep(0)
        assert not waiting.done()
        wiring.flush_states(wiring.switch())  # the checkpoint writes them: nothing is held any more
        await asyncio.sleep(0)
        assert waiting.done() and wiring.checkpoint_full is None

        outbox.later_bytes = wiring.next_epoch_max_bytes + 1  # a commit takes long: its next epoch piles up
        assert wiring.checkpoint_full == "next_epoch"
        waiting = asyncio.ensure_future(wiring.checkpoint_room())
        await asyncio.sleep(0)
        assert not waiting.done()
        wiring.committed()
        outbox.later_bytes = 0  # what Outbox.advance does right after
        await asyncio.sleep(0)
        assert waiting.done() and wiring.checkpoint_full is None
        await wiring.batcher.close()

    asyncio.run(scenario())
