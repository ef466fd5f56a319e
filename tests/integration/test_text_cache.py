"""The text-probability cache against the real Triton: a repeat gets the probability the model gives the
same input (so the same verdict), Triton computes each distinct input once, and the cache stays bounded."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from modpipe.decision.verdict import verdict_for
from streams.scoring import TextScorer

pytestmark = pytest.mark.integration


def scorer(model_build, triton_server, capacity: int) -> TextScorer:
    return TextScorer(model_build, triton_server.grpc_url, "spam_text", timeout_s=30, cache_texts=capacity)


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
