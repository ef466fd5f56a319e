"""modpipe.serving.charhead: the lexical head's character margins in numpy equal lexical.LexicalHead's, text
for text, over batches that mix edge cases (empty, whitespace only, words shorter than an n-gram, characters no
term holds, NUL, lone surrogates)."""

from __future__ import annotations

import numpy as np
import pytest

from modpipe.serving.charhead import CharHead
from modpipe.textmodel import lexical

TRAIN = ["win free cash now", "free prize claim now!!", "see you at lunch", "notes attached", "call me later ok",
         "ur awarded a £500 prize", "meeting moved to 3pm", "cheap meds online", "ça va? à demain", "x y z"]
TEXTS = ["", "   ", "a", "ab", "a b c", "win free cash now", "WIN FREE CASH", "free  free\tfree\nfree",
         "x\0y zz", "\ud800abc win", "ÀÉ Ω ça", "😀😀 prize!!!", "claim your prize now " * 30, "z" * 3000,
         "notes attached see you", "\u3000ideographic\u3000space", "unknownchars ☃☃ lunch"]


@pytest.fixture(scope="module")
def head():
    return lexical.fit_head(TRAIN * 2, [1, 1, 0, 0, 0, 1, 0, 1, 0, 0] * 2, analyzer="char_wb")


def test_margins_equal_the_python_head_in_any_batch(head):
    fast = CharHead.of(head)
    expected = head.margins(TEXTS)
    np.testing.assert_allclose(fast.margins(TEXTS), expected, rtol=0, atol=1e-12)
    for i in range(len(TEXTS)):  # alone and in other company: the same value
        np.testing.assert_allclose(fast.margins(TEXTS[i:i + 1]), expected[i:i + 1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(fast.margins(TEXTS[::-1]), expected[::-1], rtol=0, atol=1e-12)
    assert fast.margins([]).shape == (0,)
    assert len(set(np.round(expected, 9))) > 5  # the texts do move the margin


def test_only_character_heads_are_vectorised(head):
    word = lexical.fit_head(TRAIN, [1, 1, 0, 0, 0, 1, 0, 1, 0, 0], analyzer="word")
    assert CharHead.of(word) is None and CharHead.of(head) is not None
