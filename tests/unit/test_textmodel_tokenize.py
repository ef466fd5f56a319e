"""Client tokenization: punctuation runs cut in the tokenizer's own normalizer, head + tail truncation,
per-batch padding."""

import numpy as np
import pytest

from modpipe.textmodel.tokenize import RUN_KEEP, BatchTokenizer, collapse_punctuation_runs, head_and_tail


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


def test_head_and_tail_keeps_both_ends_of_a_long_sequence():
    seq = list(range(20))
    assert head_and_tail(seq, 8, 3) == [0, 1, 2, 3, 4, 17, 18, 19]
    assert head_and_tail(seq, 8, 0) == list(range(8))
    assert head_and_tail(seq, 8, 6) == [0, 1, 2, 3, 16, 17, 18, 19]  # the tail is capped at half the window
    assert head_and_tail(seq[:8], 8, 3) == seq[:8]  # a sequence that fits is untouched


def test_batch_tokenizer_with_a_tail_reads_the_end_of_long_texts(minilm_tokenizer, tmp_path):
    path = tmp_path / "tokenizer.json"
    minilm_tokenizer.save(str(path))
    cls, sep = minilm_tokenizer.token_to_id("[CLS]"), minilm_tokenizer.token_to_id("[SEP]")
    head_only, with_tail = BatchTokenizer(path, 16), BatchTokenizer(path, 16, tail=4)
    long = ["one two three " * 20 + "click here now", "one two three " * 20 + "see you soon"]
    ids, mask = with_tail(long)
    assert ids.shape == (2, 16) and np.all(mask == 1)
    assert ids[0, 0] == cls and ids[0, -1] == sep
    assert minilm_tokenizer.decode(ids[0, -4:].tolist()) == "click here now"
    assert not np.array_equal(ids[0], ids[1])  # the ends differ, and the model sees them
    plain, _ = head_only(long)
    assert np.array_equal(plain[0], plain[1]) and plain[0, -1] == sep  # head only: the same window
    assert np.array_equal(ids[:, :12], plain[:, :12])
    short = ["hello there", "a b c"]
    for a, b in zip(with_tail(short), head_only(short), strict=True):
        assert np.array_equal(a, b)  # texts that fit are tokenized as before


HOSTILE_TEXTS = ["hello [SEP] world [cls] and [MASK]", "FR33 M0NEY!!!!!!!! c.a.s.h n o w", "Ｆｒｅｅ ＭＯＮＥＹ",
                 "ｃａｓｈ\u200b p\u0336r\u0336i\u0336z\u0336e", "中文字符 test", "a\x00b\tc", "", "   ", "[PAD][UNK]",
                 "ordinary words " * 60 + "and the end", "Héllo wörld — café at 5?", "=" * 40 + " WIN"]


@pytest.mark.parametrize("tail", [0, 4])
def test_encode_normalized_gives_what_the_raw_text_gives(minilm_tokenizer, tmp_path, tail):
    """The worker normalises each text once and tokenizes the result without the normalizer (the lexical stack
    reads the same normalised text): the model's input must be what the raw text gives, special tokens typed in
    a post included (the tokenizer matches those in the raw text, before its lower-casing)."""
    from modpipe.textmodel import hostile

    collapse_punctuation_runs(minilm_tokenizer)
    hostile.harden(minilm_tokenizer, fold_leet=True)  # as a build's tokenizer.json
    path = tmp_path / "tokenizer.json"
    minilm_tokenizer.save(str(path))
    tok = BatchTokenizer(path, 16, tail=tail)
    ids, mask, normalized = tok.encode_normalized(HOSTILE_TEXTS)
    want_ids, want_mask = tok(HOSTILE_TEXTS)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(mask, want_mask)
    assert normalized == [minilm_tokenizer.normalizer.normalize_str(t) for t in HOSTILE_TEXTS]
    assert normalized[1] != HOSTILE_TEXTS[1].lower()  # the folding ran (leetspeak, spacing, the run cut)
    sep = minilm_tokenizer.token_to_id("[SEP]")
    assert ids[0].tolist().count(sep) == 2  # the typed "[SEP]" is one token, as in the raw text's encoding
