"""Posts still waiting for the text model when their checkpoint commits (streams/moderation/carried.py), without
Kafka or Triton: carried as state, their rounds complete at once; their decisions, made later, go out in a round
of the epoch open then with their record's tombstone; a partition's next owner decides them from the restored
table; a worker that gave their partition up publishes nothing for them."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
from modpipe.streams.checkpointing.outbox import Pending
from modpipe.streams.moderation import carried
from modpipe.streams.moderation.bundles import partition_for
from modpipe.streams.moderation.decisions import DecisionBatcher, Publisher
from modpipe.streams.moderation.topics import TopicNames
from modpipe.streams.state.ends import ChangelogEnds

from modpipe.decision.verdict import ThresholdDecider
from modpipe.settings import Settings
from tests.unit.test_text_model_outage import ready_post, scorer

PARTITIONS = 4


class SlowClient:
    """Answers each request only once the test lets it (`answer`)."""

    def __init__(self):
        self.requests = 0
        self.answer = asyncio.Event()

    async def spam_probabilities_text(self, texts):
        self.requests += 1
        await self.answer.wait()
        return np.full(len(texts), 0.97)

    async def spam_probabilities(self, ids, mask):
        return await self.spam_probabilities_text(list(ids))

    async def close(self):
        pass


class Outbox:
    """Keeps every record with the epoch of its Pending, and the Pending's hold (a record not yet delivered)."""

    def __init__(self):
        self.records: list[tuple[str, bytes | None, bytes | None, int | None, int | None]] = []
        self.held: list[Pending] = []

    def produce(self, topic, value, *, key=None, partition=None, pending=None, on_delivered=None, **kwargs):
        self.records.append((topic, key, value, partition, pending.epoch))
        pending.hold()
        self.held.append(pending)

    def deliver(self):
        held, self.held = self.held, []
        for pending in held:
            pending.release()

    def of(self, topic):
        return [r for r in self.records if r[0] == topic]


def make(open_epoch: list[int]):
    s, _ = scorer("wait")
    s._client = client = SlowClient()
    outbox = Outbox()
    topics = TopicNames.from_settings(Settings.from_env({}))
    store = carried.CarriedPosts(carried.make_table(topics.awaiting_model), outbox, ChangelogEnds(), PARTITIONS)
    publisher = Publisher(outbox, topics, {"text_model": "test-v1", "decider": "thresholds-v1"})
    opened: list[Pending] = []

    def open_round():
        pending = Pending(epoch=open_epoch[0])
        opened.append(pending)
        return pending

    batcher = DecisionBatcher(s, ThresholdDecider(), publisher, max_batch=8, max_wait_s=0.0, max_inflight=1,
                              on_error=print, feedback=lambda items, pending: None, open_round=open_round,
                              carried_decided=store.decided)
    return batcher, client, outbox, store, topics, opened


def one_round(posts, epoch: int, on_done=None) -> Pending:
    """The round the posts became ready in: it waits for their decisions only."""
    source = Pending(on_done=on_done, epoch=epoch)
    for post in posts:
        post.source = source
        source.hold()
    source.seal()
    return source


async def until_at_triton(batcher, client, posts) -> None:
    batcher.submit(posts)
    while client.requests == 0:
        await asyncio.sleep(0.01)


def test_a_post_at_triton_is_carried_as_state_and_decided_later_in_the_epoch_open_then():
    open_epoch = [4]
    batcher, client, outbox, store, topics, opened = make(open_epoch)
    done: list[int] = []
    posts = [ready_post(1), ready_post(2)]
    one_round(posts, 4, on_done=lambda: done.append(4))

    async def run():
        await until_at_triton(batcher, client, posts)
        assert batcher.undecided(4) == posts and batcher.undecided(5) == []
        checkpoint = Pending(epoch=4)
        batcher.carry(batcher.undecided(4), lambda post: store.carry(post, checkpoint))
        checkpoint.seal()
        # the round no longer waits for Triton: epoch 4 can commit, with the posts as state in its transaction
        assert done == [4] and batcher.undecided(4) == []
        kept = outbox.of(topics.awaiting_model)
        assert [(orjson.loads(k), partition, epoch) for _, k, _, partition, epoch in kept] == \
            [(p.post["post_id"], partition_for(p.post["post_id"], PARTITIONS), 4) for p in posts]
        assert store.table.keys() == 2 and not outbox.of(topics.decisions)
        open_epoch[0] = 6  # two checkpoints later Triton answers
        client.answer.set()
        while len(outbox.of(topics.decisions)) < 2:
            await asyncio.sleep(0.01)
        await batcher.close()

    asyncio.run(run())
    decided = outbox.of(topics.decisions)
    assert sorted(orjson.loads(v)["post_id"] for _, _, v, _, _ in decided) == ["p1", "p2"]
    assert {epoch for *_, epoch in decided} == {6}, "a carried post's decision goes into the transaction open then"
    tombstones = [(orjson.loads(k), epoch) for _, k, v, _, epoch in outbox.of(topics.awaiting_model) if v is None]
    assert sorted(tombstones) == [("p1", 6), ("p2", 6)], "its state is deleted in the same transaction"
    assert store.table.keys() == 0
    assert len(opened) == 1  # one round for the batch's carried posts


def test_the_next_owner_decides_the_restored_posts_and_the_old_one_publishes_nothing_for_them():
    open_epoch = [1]
    batcher, client, outbox, store, topics, _ = make(open_epoch)
    posts = [ready_post(i) for i in range(1, 6)]
    one_round(posts, 1)

    async def old_owner():
        await until_at_triton(batcher, client, posts)
        checkpoint = Pending(epoch=1)
        batcher.carry(batcher.undecided(1), lambda post: store.carry(post, checkpoint))
        # the revocation: its partitions go to another worker, the batch still at Triton
        assert batcher.drop(lambda post: True) == len(posts)
        client.answer.set()
        await asyncio.sleep(0.1)
        await batcher.close()

    asyncio.run(old_owner())
    assert not outbox.of(topics.decisions), "a dropped post is decided by its partition's next owner only"

    # the next owner restores the changelog (records as they were written) and decides every post once
    batcher2, client2, outbox2, store2, topics2, _ = make([9])
    table = store2.table
    for partition in range(PARTITIONS):
        table.restore_begin(partition)
    for _, key, value, partition, _ in outbox.of(topics.awaiting_model):
        table.restore_apply(partition, key, value, 0, 0)
    for partition in range(PARTITIONS):
        table.restore_end(partition)
    restored = store2.restored(range(PARTITIONS))
    assert sorted(p.post["post_id"] for p in restored) == sorted(p.post["post_id"] for p in posts)
    originals = {p.post["post_id"]: p for p in posts}
    for p in restored:
        o = originals[p.post["post_id"]]
        assert (p.post, p.ctx, p.features, p.received_at_ms) == (o.post, o.ctx, o.features, o.received_at_ms)
        assert p.carried and p.source is None

    async def new_owner():
        client2.answer.set()
        batcher2.submit(restored)
        while len(outbox2.of(topics2.decisions)) < len(posts):
            await asyncio.sleep(0.01)
        await batcher2.close()

    asyncio.run(new_owner())
    assert sorted(orjson.loads(v)["post_id"] for _, _, v, _, _ in outbox2.of(topics2.decisions)) == \
        sorted(originals)
    assert len([r for r in outbox2.of(topics2.awaiting_model) if r[2] is None]) == len(posts)


def test_a_post_decided_before_its_checkpoint_gave_up_waiting_is_not_carried():
    batcher, client, outbox, store, topics, opened = make([2])
    post = ready_post(1)
    one_round([post], 2)

    async def run():
        client.answer.set()
        batcher.submit([post])
        while not outbox.of(topics.decisions):
            await asyncio.sleep(0.01)
        assert batcher.undecided(2) == []  # decided: it waits only for its delivery
        await batcher.close()

    asyncio.run(run())
    assert not outbox.of(topics.awaiting_model) and not opened
    assert outbox.of(topics.decisions)[0][4] == 2


def test_a_post_is_no_longer_undecided_once_triton_answered_though_its_batch_task_has_not_ended():
    """A checkpoint that gives up waiting at the moment a batch's decisions are produced must not carry those
    posts too: their records would be decided again by the partition's next owner, and their rounds released
    twice."""
    batcher, client, outbox, store, topics, _ = make([3])
    posts = [ready_post(1), ready_post(2)]
    one_round(posts, 3)
    seen: list[list] = []
    produce = outbox.produce

    def produce_and_look(topic, value, **kwargs):
        if topic == topics.decisions:
            seen.append(batcher.undecided(3))  # what a checkpoint would carry at this moment
        produce(topic, value, **kwargs)

    outbox.produce = produce_and_look

    async def run():
        await until_at_triton(batcher, client, posts)
        assert batcher.undecided(3) == posts
        client.answer.set()
        while len(outbox.of(topics.decisions)) < 2:
            await asyncio.sleep(0.01)
        await batcher.close()

    asyncio.run(run())
    assert seen == [[], []]
