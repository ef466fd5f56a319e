"""A Triton batch whose posts come from rounds of two checkpoint epochs (streams/checkpointing/checkpoint.py): each post's
decision and feedback go out under a `Pending` of its own round's epoch, so the outbox puts them into that
epoch's transaction, and each round is released only when its own posts' decisions are delivered."""

from __future__ import annotations

import asyncio

import orjson
from modpipe.streams.checkpointing.outbox import Pending
from modpipe.streams.moderation.decisions import DecisionBatcher, Publisher
from modpipe.streams.moderation.topics import TopicNames

from modpipe.decision.verdict import ThresholdDecider
from modpipe.settings import Settings
from tests.unit.test_text_model_outage import ready_post, scorer


class EpochOutbox:
    """Records (topic, post_id, the epoch of the record's Pending) and keeps each Pending's hold, as a
    record not yet delivered does."""

    def __init__(self):
        self.records: list[tuple[str, str, int | None]] = []
        self.held: list[Pending] = []

    def produce(self, topic, value, *, key=None, partition=None, pending=None, **kwargs):
        self.records.append((topic, orjson.loads(value)["post_id"], pending.epoch))
        pending.hold()
        self.held.append(pending)


def test_a_batch_across_two_epochs_publishes_each_decision_in_its_own_epoch():
    s, client = scorer("decide")
    client.down = False
    outbox = EpochOutbox()
    topics = TopicNames.from_settings(Settings.from_env({}))
    publisher = Publisher(outbox, topics, {"text_model": "test-v1", "decider": "thresholds-v1"})
    feedback: list[int | None] = []
    batcher = DecisionBatcher(s, ThresholdDecider(), publisher, max_batch=8, max_wait_s=0.0, max_inflight=1,
                              on_error=print, feedback=lambda items, pending: feedback.append(pending.epoch))
    released: list[int] = []
    rounds = {epoch: Pending(on_done=lambda epoch=epoch: released.append(epoch), epoch=epoch) for epoch in (4, 5)}
    posts = [ready_post(1), ready_post(2), ready_post(3)]
    for post, epoch in zip(posts, (4, 5, 4), strict=True):
        post.source = rounds[epoch]
        rounds[epoch].hold()
    for pending in rounds.values():
        pending.seal()  # the rounds produced everything else: only their posts' decisions hold them now

    async def run():
        batcher.submit(posts)
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len(outbox.records) == 3:
                break
        await batcher.close()

    asyncio.run(run())
    assert sorted(outbox.records) == [(topics.decisions, "p1", 4), (topics.decisions, "p2", 5),
                                      (topics.decisions, "p3", 4)]
    assert sorted(feedback) == [4, 5] and released == []  # nothing delivered yet: both rounds wait
    for pending in outbox.held:
        if pending.epoch == 5:
            pending.release()  # epoch 5's decision delivered
    assert released == [5]
    for pending in outbox.held:
        if pending.epoch == 4:
            pending.release()
    assert released == [5, 4]
