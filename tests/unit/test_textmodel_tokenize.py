"""Client tokenization: punctuation runs cut in the tokenizer's own normalizer, per-batch padding."""

import numpy as np
import pytest

from modpipe.textmodel.tokenize import RUN_KEEP, BatchTokenizer, collapse_punctuation_runs


@pytest.fixture()
def minilm_tokenizer():
    from tokenizers import Tokenizer

    from modpipe.textmodel import convert

    tok = Tokenizer.from_file(str(convert.minilm_dir() / "tokenizer.json"))
    tok.no_padding()  # the checkpoint's file pads to 128; the build's does not
    return tok


def _tokens(tok, text):
    return tok.encode(text).tokens


def test_runs_are_cut_to_three_and_ordinary_text_is_untouched(minilm_tokenizer):
    plain = _tokens(minilm_tokenizer, "==================== WIN!!!!!!!! a... b.... see http://x.io/a?b")
    collapse_punctuation_runs(minilm_tokenizer)
    cut = _tokens(minilm_tokenizer, "==================== WIN!!!!!!!! a... b.... see http://x.io/a?b")
    assert plain.count("=") == 20 and cut.count("=") == RUN_KEEP
    assert cut.count("!") == RUN_KEEP
    assert len(cut) == len(plain) - (20 - 3) - (8 - 3) - (4 - 3)
    for ordinary in ("Hello, you've WON £1000 (call 0800-123)! Café: naïve?", "a -- b ** c", "?!?!", "wait..."):
        assert _tokens(minilm_tokenizer, ordinary) == _tokens(_plain_copy(minilm_tokenizer), ordinary)


def _plain_copy(tok):
    """The same tokenizer without the run rules (the last normalizer of the sequence is the original)."""
    import json

    from tokenizers import Tokenizer

    doc = json.loads(tok.to_str())
    doc["normalizer"] = doc["normalizer"]["normalizers"][-1]
    return Tokenizer.from_str(json.dumps(doc))


def test_rules_travel_in_tokenizer_json(minilm_tokenizer, tmp_path):
    """Training, the client and Triton's spam_tokenizer read the build's tokenizer.json: the rules must be in it."""
    collapse_punctuation_runs(minilm_tokenizer)
    path = tmp_path / "tokenizer.json"
    minilm_tokenizer.save(str(path))
    ids, mask = BatchTokenizer(path, 128)(["-" * 200 + " free prize", "hi"])
    assert ids.shape == (2, 1 + RUN_KEEP + 2 + 1)  # [CLS] --- free prize [SEP]
    assert mask.sum(axis=1).tolist() == [ids.shape[1], 3]


def test_batch_is_padded_to_its_longest_text_and_truncated(minilm_tokenizer, tmp_path):
    path = tmp_path / "tokenizer.json"
    minilm_tokenizer.save(str(path))
    tok = BatchTokenizer(path, 16)
    ids, mask = tok(["one two three", "a " * 100])
    assert ids.shape == (2, 16) and mask[0].sum() == 5 and mask[1].sum() == 16
    ids, mask = tok(["one", "two"])
    assert ids.shape == (2, 3) and np.all(mask == 1)
    ids, _ = tok(["one"], pad_to_max=True)
    assert ids.shape == (1, 16)
