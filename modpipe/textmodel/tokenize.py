"""Client-side tokenization: the fast tokenizer, each batch padded only to its longest text."""

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


class BatchTokenizer:
    """Turns a batch of texts into (input_ids, attention_mask) int64 arrays.

    Padding goes to the longest text of the batch, not to `max_len`: short posts then cost short
    sequences in the model. `pad_to_max=True` pads to `max_len` (the naive approach, for benchmarks).
    """

    def __init__(self, tokenizer_json: Path | str, max_len: int = 128):
        self.max_len = max_len
        self._tok = Tokenizer.from_file(str(tokenizer_json))
        self._tok.enable_truncation(max_length=max_len)
        self._tok.no_padding()
        self.pad_id = self._tok.token_to_id("[PAD]") or 0

    def __call__(self, texts: Sequence[str], pad_to_max: bool = False) -> tuple[np.ndarray, np.ndarray]:
        encodings = self._tok.encode_batch(list(texts))
        width = self.max_len if pad_to_max else max((len(e.ids) for e in encodings), default=1)
        width = max(width, 1)
        ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = 1
        return ids, mask
