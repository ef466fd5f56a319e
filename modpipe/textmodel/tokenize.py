"""Client-side tokenization: the fast tokenizer, head + tail truncation, each batch padded only to its
longest text."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, normalizers

# WordPiece makes one token of each punctuation character, so an ASCII rule ("=====...", "-----...") or
# "!!!!!!!!" can fill the 128-token window. Runs of 4+ are cut to 3 (the emphasis stays visible):
# SpamAssassin e-mails lose ~10% of their tokens and the window sees more of their text.
COLLAPSED_PUNCTUATION = "-=_*~#+.!?/\\|<>:;^%$&@,'\"`()[]{}"
RUN_KEEP = 3


def collapse_punctuation_runs(tokenizer: Tokenizer) -> Tokenizer:
    """Prepend run-collapsing rules to the tokenizer's normalizer (in place; saved with tokenizer.json, so
    training, the client, and Triton's tokenizer model all read the same)."""
    rules = [normalizers.Replace(Regex(f"{re.escape(c)}{{{RUN_KEEP + 1},}}"), c * RUN_KEEP)
             for c in COLLAPSED_PUNCTUATION]
    current = tokenizer.normalizer
    tokenizer.normalizer = normalizers.Sequence(rules + ([current] if current is not None else []))
    return tokenizer


def head_and_tail(ids: list[int], max_len: int, tail: int) -> list[int]:
    """The first `max_len - tail` and the last `tail` ids of a sequence longer than `max_len`.

    An e-mail's end (the list footer or the "to be removed" block, the signature) tells spam from ham
    better than its middle: a TF-IDF model that sees 64 head + 64 tail tokens of a SpamAssassin e-mail
    makes 28 held-out errors, one that sees the first 128 makes 41. `ids` are encoded with their special
    tokens, so `[CLS]` stays first and `[SEP]` last. `tail` is capped at half the window."""
    if len(ids) <= max_len:
        return list(ids)
    tail = min(tail, max_len // 2)
    return list(ids[:max_len - tail]) + (list(ids[len(ids) - tail:]) if tail else [])


def prepare(tokenizer: Tokenizer, max_len: int, tail: int) -> Tokenizer:
    """Set `tokenizer` up for `encode_ids`: no padding; truncation by the library when there is no tail
    (it keeps `[SEP]`), none when there is (`head_and_tail` cuts the full encoding)."""
    tokenizer.no_padding()
    if tail > 0:
        tokenizer.no_truncation()
    else:
        tokenizer.enable_truncation(max_length=max_len)
    return tokenizer


def encode_ids(tokenizer: Tokenizer, texts: Sequence[str], max_len: int, tail: int) -> list[list[int]]:
    """Token ids per text, at most `max_len`, the last `tail` of them from the text's end (see `prepare`)."""
    encodings = tokenizer.encode_batch(list(texts))
    if tail <= 0:
        return [e.ids for e in encodings]
    return [head_and_tail(e.ids, max_len, tail) for e in encodings]


class BatchTokenizer:
    """Turns a batch of texts into (input_ids, attention_mask) int64 arrays.

    Padding goes to the longest text of the batch, not to `max_len`: short posts then cost short
    sequences in the model. `pad_to_max=True` pads to `max_len` (the naive approach, for benchmarks).
    A text longer than `max_len` keeps its first `max_len - tail` and last `tail` tokens.
    """

    def __init__(self, tokenizer_json: Path | str, max_len: int = 128, tail: int = 0):
        self.max_len = max_len
        self.tail = tail
        self._tok = prepare(Tokenizer.from_file(str(tokenizer_json)), max_len, tail)
        self.pad_id = self._tok.token_to_id("[PAD]") or 0
        # `encode_normalized`: the same tokenizer without its normalizer reads text normalised beforehand. Added
        # tokens that are matched before normalisation ("[SEP]" typed in a post is one token) are looked for in
        # the raw text instead.
        self._normalizer = self._tok.normalizer
        self._prenormalized = prepare(Tokenizer.from_file(str(tokenizer_json)), max_len, tail)
        self._prenormalized.normalizer = None
        self._raw_matched = tuple(t.content for t in self._tok.get_added_tokens_decoder().values() if not t.normalized)

    @classmethod
    def for_build(cls, build, max_len: int | None = None) -> BatchTokenizer:
        """The tokenization a build was trained with (its tokenizer.json, window and tail)."""
        return cls(build.tokenizer, max_len or build.max_seq_len, build.tail_tokens)

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        return encode_ids(self._tok, texts, self.max_len, self.tail)

    def normalize(self, texts: Sequence[str]) -> list[str]:
        """Each text as the tokenizer's normalizer leaves it (punctuation runs cut, the hostile-text folding,
        lower case): what the lexical stack reads."""
        if self._normalizer is None:
            return list(texts)
        normalize = self._normalizer.normalize_str
        return [normalize(t) for t in texts]

    def encode_normalized(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(input_ids, attention_mask, normalised texts): the arrays `self(texts)` gives and `normalize(texts)`,
        with the normalizer run once a text instead of twice. On a GPU host the normaliser is ~a third of the
        worker's text path (docs/benchmarks.md), and the worker needs both (streams/moderation/scoring.py)."""
        normalized = self.normalize(texts)
        seqs = encode_ids(self._prenormalized, normalized, self.max_len, self.tail)
        for i, text in enumerate(texts):
            if any(token in text for token in self._raw_matched):
                seqs[i] = self.ids([text])[0]
        ids, mask = self.pad(seqs)
        return ids, mask, normalized

    def __call__(self, texts: Sequence[str], pad_to_max: bool = False) -> tuple[np.ndarray, np.ndarray]:
        return self.pad(self.ids(texts), pad_to_max)

    def pad(self, seqs: Sequence[Sequence[int]], pad_to_max: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids, attention_mask) of token id sequences, padded to the longest (or to `max_len`)."""
        width = self.max_len if pad_to_max else max((len(s) for s in seqs), default=1)
        width = max(width, 1)
        ids = np.full((len(seqs), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(seqs), width), dtype=np.int64)
        for row, seq in enumerate(seqs):
            ids[row, :len(seq)] = seq
            mask[row, :len(seq)] = 1
        return ids, mask
