"""Where the wiring applies an item: here when this worker owns its stage partition, else in a bundle for the
owner; what it remembers per partition follows every rebalance."""

from __future__ import annotations

import asyncio
import random

from modpipe.loadgen.posts import make_post
from modpipe.streams.kafka.records import TP, Record
from modpipe.streams.moderation.agents import PartitionEvent, Wiring, make_handlers
from modpipe.streams.moderation.app import create_pipeline
from modpipe.streams.moderation.bans import BanRegistry
from modpipe.streams.moderation.bundles import decode_bundle, partition_for

from modpipe import schema
from modpipe.decision.verdict import ThresholdDecider
from modpipe.settings import Settings
from tests.unit.test_text_model_outage import scorer


class Outbox:
    def __init__(self):
        self.records: list[tuple[str, int | None, bytes]] = []

    def produce(self, topic, value, *, key=None, partition=None, pending=None, **kwargs):
        self.records.append((topic, partition, value))
        if pending is not None:
            pending.hold()
            pending.release()


def _round(wiring, ingest, pipe, posts):
    records = [Record(pipe.topics.posts, 0, i, None, schema.dumps(p), 1_700_000_000_000) for i, p in enumerate(posts)]
    wiring.outbox.records.clear()
    ingest(records)
    bundled = {}
    for topic, partition, value in wiring.outbox.records:
        if topic in pipe.topics.stages.values():
            bundled.setdefault((topic, partition), []).extend(decode_bundle(value))
    return bundled


def test_items_go_to_the_owner_of_their_partition_and_follow_each_rebalance():
    settings = Settings.from_env({"MODPIPE_TEXT_MODEL": "off"})
    pipe = create_pipeline(settings)
    s, _ = scorer("decide")
    outbox = Outbox()
    wiring = Wiring(pipe, settings, s, ThresholdDecider(), BanRegistry(settings, "unused:0", "bans"), outbox)
    ingest = make_handlers(wiring, settings, s, ThresholdDecider())[pipe.topics.posts]
    user_topic = pipe.topics.stages["user"]
    rng = random.Random(7)
    posts = [make_post(rng, f"hop-{i}", "see you at lunch", user_id=f"u{i}") for i in range(40)]
    mine = {p["user_id"] for p in posts if partition_for(p["user_id"], pipe.partitions) == 0}
    assert 0 < len(mine) < len(posts)

    async def run():
        # only partition 0 of the user stage: every other post's first hop is bundled for its owner
        wiring.assigned([TP(user_topic, 0)])
        bundled = _round(wiring, ingest, pipe, posts)
        first_hops = {item["post"]["user_id"] for (topic, _), items in bundled.items() if topic == user_topic
                      for item in items}
        assert first_hops == {p["user_id"] for p in posts} - mine
        assert all(partition == partition_for(item["post"]["user_id"], pipe.partitions)
                   for (topic, partition), items in bundled.items() if topic == user_topic for item in items)
        # every partition: nothing is bundled for the user stage any more
        wiring.assigned([TP(t, p) for t in pipe.topics.stages.values() for p in range(pipe.partitions)])
        assert not [k for k in _round(wiring, ingest, pipe, [dict(p, post_id=p["post_id"] + "b") for p in posts])
                    if k[0] == user_topic]
        # revoked: every first hop goes through Kafka again
        wiring.revoked()
        bundled = _round(wiring, ingest, pipe, [dict(p, post_id=p["post_id"] + "c") for p in posts])
        assert sum(len(items) for (topic, _), items in bundled.items() if topic == user_topic) == len(posts)
        await wiring.batcher.close()

    asyncio.run(run())


def test_a_verdict_goes_back_to_the_tables_in_place_while_its_epoch_is_open_else_through_the_stage_topics():
    settings = Settings.from_env({"MODPIPE_TEXT_MODEL": "off"})
    pipe = create_pipeline(settings)
    s, client = scorer("decide")
    client.down = False  # every text 0.97: blocked, so the verdict goes to the user, ip and post tables
    outbox = Outbox()
    wiring = Wiring(pipe, settings, s, ThresholdDecider(), BanRegistry(settings, "unused:0", "bans"), outbox)
    ingest = make_handlers(wiring, settings, s, ThresholdDecider())[pipe.topics.posts]
    wiring.assigned([TP(t, p) for t in pipe.topics.stages.values() for p in range(pipe.partitions)])
    rng = random.Random(11)
    posts = [make_post(rng, f"fb-{i}", "win cash now", user_id=f"u{i}") for i in range(12)]
    states = wiring.stages["post"].states["post"]

    def decision_of(post_id):
        event = PartitionEvent(pipe.topics.stages["post"], partition_for(post_id, pipe.partitions))
        return states.state(post_id, event).decision

    def fed_back():  # feedback items produced to the stage topics since the round
        return [item for topic, _, value in outbox.records if topic in pipe.topics.stages.values()
                for item in decode_bundle(value) if item["kind"] == "decision"]

    async def run():
        # the epoch stays open until the verdicts are in: applied here, nothing through Kafka
        _round(wiring, ingest, pipe, posts[:6])
        await asyncio.wait_for(wiring.idle(), 5.0)  # every round complete: its posts decided
        assert all(decision_of(p["post_id"]) is not None for p in posts[:6])
        assert fed_back() == []
        # the epoch closes (a checkpoint wrote its states) before Triton answers: through the stage topics
        _round(wiring, ingest, pipe, posts[6:])
        wiring.switch()
        await asyncio.wait_for(wiring.idle(), 5.0)
        await wiring.batcher.close()
        assert all(decision_of(p["post_id"]) is None for p in posts[6:])
        assert {item["ctx"]["post_id"] for item in fed_back()} == {p["post_id"] for p in posts[6:]}
        assert {item["to"][0][0] for item in fed_back()} == {"user", "ip", "post"}

    asyncio.run(run())
