"""The text-probability cache against the real Triton: a repeat gets the probability the model gives the
same input (so the same verdict), Triton computes each distinct input once, and the cache stays bounded."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from modpipe.streams.moderation.scoring import TextScorer

from modpipe.decision.verdict import verdict_for

pytestmark = pytest.mark.integration


def scorer(model_build, triton_server, capacity: int, text_path: str = "worker") -> TextScorer:
    return TextScorer(model_build, triton_server.grpc_url, "spam_text", timeout_s=30, cache_texts=capacity,
                      text_path=text_path)


async def score_rounds(s: TextScorer, rounds: list[list[str]]) -> list[np.ndarray]:
    try:
        return [await s.spam_probabilities(texts) for texts in rounds]
    finally:
        await s.close()


def test_cached_probabilities_are_the_scored_ones_and_change_no_verdict(model_build, triton_server):
    texts = [t["text"] for t in model_build.heldout()[:40]]
    # a campaign: the same texts again, in other batches and orders, and a case/spacing variant that
    # tokenizes to the same ids
    rounds = [texts[:20], texts[10:30] + texts[:5], list(reversed(texts)), [texts[3].upper(), "  " + texts[4]]]
    cached = scorer(model_build, triton_server, capacity=1000)
    with_cache = asyncio.run(score_rounds(cached, rounds))
    without = asyncio.run(score_rounds(scorer(model_build, triton_server, capacity=0), rounds))
    # Triton computed each distinct input once; every repeat and both variants (the tokenizer is uncased
    # and splits on whitespace) came from the cache
    assert cached.cache.misses == len(set(texts))
    assert cached.cache.hits == sum(map(len, rounds)) - len(set(texts))
    for got, expected in zip(with_cache, without, strict=True):
        # Triton's fp32 model is batch-invariant within 1e-4 (the build's export check): a cached value
        # is that same computation from another batch
        np.testing.assert_allclose(got, expected, atol=1e-4)
        assert [verdict_for(p, 0.5, 0.9) for p in got] == [verdict_for(p, 0.5, 0.9) for p in expected]


def test_the_cache_is_bounded(model_build, triton_server):
    texts = [t["text"] for t in model_build.heldout()[:60]]
    s = scorer(model_build, triton_server, capacity=16)
    asyncio.run(score_rounds(s, [texts[i:i + 20] for i in range(0, 60, 20)]))
    assert len(s.cache) == 16


def test_the_triton_path_serves_what_the_worker_path_computes(model_build, triton_server):
    """MODPIPE_TEXT_PATH=triton (raw texts to spam_text_ensemble: Triton tokenizes and applies the stack with
    charhead.py) against the worker path of before (client-side tokenizer, spam_text, lexical.py's own head), on
    held-out texts of the build and hostile edge cases: the same served probability within 1e-5; with the cache,
    repeats and case or whitespace variants come from it with the value Triton gave."""
    texts = [t["text"] for t in model_build.heldout()[:150]] + [
        "", "   \n\t ", "a", "免费赢取iPhone！立即点击链接领取奖品", "😀🎉🔥 win 💰💰💰", "[SEP] free [CLS] money",
        "ΟΔΟΣ ΠΡΟΣ ΤΗΝ ΝΙΚΗ", "W\u200bI\u200bN a fr\u00adee pr1ze!!!!!!!", "x" * 12_000]
    stack = model_build.stack()
    assert stack is not None, f"build {model_build.version} has no lexical head"

    async def both():
        worker = TextScorer(model_build, triton_server.grpc_url, "spam_text", timeout_s=60, cache_texts=0,
                            text_path="worker")
        worker._margins = worker.stack.head.margins  # lexical.py's own head, as before charhead.py
        triton = TextScorer(model_build, triton_server.grpc_url, "spam_text", timeout_s=60, cache_texts=1000)
        try:
            chunks = [texts[i:i + 64] for i in range(0, len(texts), 64)]
            expected = np.concatenate([await worker.spam_probabilities(c) for c in chunks])
            served = np.concatenate([await triton.spam_probabilities(c) for c in chunks])
            variants = [texts[0].upper() if texts[0].isascii() else texts[0], "  " + texts[1] + "\n", texts[2]]
            again = await triton.spam_probabilities(variants)
            return expected, served, again, triton.cache.hits
        finally:
            await worker.close()
            await triton.close()

    expected, served, again, hits = asyncio.run(both())
    assert triton_text_path_is_default()
    np.testing.assert_allclose(served, expected, rtol=0, atol=1e-5)
    assert hits == 3
    np.testing.assert_array_equal(again, served[:3])


def triton_text_path_is_default() -> bool:
    from modpipe.settings import Settings

    return Settings.from_env({}).text_path == "triton"
