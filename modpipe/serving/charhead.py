"""The lexical head's margins over a whole batch in numpy: what `lexical.LexicalHead.margins` computes for a
character (`char_wb`) head, term for term, without a Python loop over n-grams.

`LexicalHead.margin` builds every character 2-5 gram of a text as a Python string and looks it up in a dict:
~0.8 ms for a 640-character post (docs/benchmarks.md). Here each n-gram is an integer: the head's terms use a
small alphabet (759 characters in the full build), so a character is a code of `bits` bits (0: a character no
term holds) and an n-gram of up to five of them, with its length in the top bits, is one uint64, exact, no
hashing. A batch's n-grams are looked up in the sorted term keys at once, counted per text, and weighted as
`LexicalHead` does (sublinear tf, idf, l2 norm, the linear weights): the same margin up to float rounding.

Runs in the worker and in Triton's python backend (the launcher copies this file beside spam_postprocess's
`model.py` with lexical.py): numpy only, no modpipe imports.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

NGRAMS = (2, 5)  # lexical.CHAR_NGRAMS: the analyzer this reads
_LENGTH_SHIFT = 60  # the n-gram's length lives above the characters' bits
_EMPTY = np.uint64(0)  # no key is 0: every key carries its length
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: the top bits of key * this pick the slot


def _hash_table(keys: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.uint64]:
    """An open-addressing table (linear probing) of at most 40% load: numpy has no hash map, and a sorted
    array's binary search costs a dozen cache misses a lookup where this costs about one."""
    bits = max(4, int(len(keys) * 2.5).bit_length())
    size = 1 << bits
    table, values = np.zeros(size, dtype=np.uint64), np.full(size, -1, dtype=np.int64)
    shift = np.uint64(64 - bits)
    with np.errstate(over="ignore"):
        slots = (keys * _MULTIPLIER) >> shift
    for key, value, slot in zip(keys.tolist(), index.tolist(), slots.tolist(), strict=True):
        while table[slot]:
            slot = (slot + 1) & (size - 1)
        table[slot], values[slot] = key, value
    return table, values, shift


class CharHead:
    """Margins of a `char_wb` head (`lexical.LexicalHead` with analyzer "char_wb") for batches of normalised texts."""

    def __init__(self, vocabulary: dict[str, int], idf: np.ndarray, coef: np.ndarray, intercept: float):
        alphabet = sorted({c for term in vocabulary for c in term})
        if "\0" in alphabet or " " not in alphabet:
            raise ValueError("a char_wb head's terms hold the padding space and never NUL (the text separator)")
        self.bits = max(1, int(len(alphabet)).bit_length())  # codes 1..len(alphabet); 0 = not in any term
        low, high = NGRAMS
        if high * self.bits > _LENGTH_SHIFT:
            raise ValueError(f"{len(alphabet)} characters: {high} of them do not fit a 64-bit key")
        if any(not low <= len(t) <= high for t in vocabulary):
            raise ValueError(f"a term outside {low}-{high} characters: not a char_wb head")
        self._chars = np.array([ord(c) for c in alphabet], dtype=np.uint32)  # sorted code points
        self._space = np.uint64(alphabet.index(" ") + 1)
        keys = np.array([self._key_of(t) for t in vocabulary], dtype=np.uint64)
        index = np.fromiter(vocabulary.values(), dtype=np.int64, count=len(vocabulary))
        self._table_keys, self._table_index, self._shift = _hash_table(keys, index)
        self.idf = np.asarray(idf, dtype=np.float64)
        self.coef = np.asarray(coef, dtype=np.float64)
        self.intercept = float(intercept)

    @classmethod
    def of(cls, head) -> CharHead | None:
        """The vectorised form of a `lexical.LexicalHead`, or None when it is not a character head (a word
        head keeps its own `margins`)."""
        if getattr(head, "analyzer", None) != "char_wb":
            return None
        return cls(head.vocabulary, head.idf, head.coef, head.intercept)

    def _key_of(self, term: str) -> int:
        key = len(term) << _LENGTH_SHIFT
        for k, ch in enumerate(term):
            key |= (int(np.searchsorted(self._chars, ord(ch))) + 1) << (self.bits * k)
        return key

    def _codes(self, joined: str) -> np.ndarray:
        # surrogatepass: a lone surrogate (JSON allows one) is one unknown character, as str indexing counts it
        points = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        pos = np.searchsorted(self._chars, points)
        pos_c = np.minimum(pos, len(self._chars) - 1)
        return np.where(self._chars[pos_c] == points, pos + 1, 0).astype(np.uint64)

    def _lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions in `keys` that are terms, their term indices): linear probing, all keys a round."""
        table, index, mask = self._table_keys, self._table_index, np.uint64(len(self._table_keys) - 1)
        slot = (keys * _MULTIPLIER) >> self._shift
        todo = np.arange(len(keys))
        hit_at, hit_term = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
        while len(todo):
            found = table[slot]
            match = found == keys[todo]
            hit_at.append(todo[match])
            hit_term.append(index[slot[match]])
            going = ~match & (found != _EMPTY)
            todo, slot = todo[going], (slot[going] + np.uint64(1)) & mask
        return np.concatenate(hit_at), np.concatenate(hit_term)

    def margins(self, normalized: Sequence[str]) -> np.ndarray:
        """One margin per normalised text: the words of each (lower-cased, split on whitespace) padded with a
        space either side, the character n-grams within a padded word (a word shorter than n gives itself
        once: the only window of its length), as `lexical.char_terms` lists them."""
        n_texts = len(normalized)
        out = np.full(n_texts, self.intercept, dtype=np.float64)
        if not n_texts:
            return out
        # Words joined by one space with a space at each end: padded word j is the span from the space before
        # it to the space after it, both shared with its neighbours; a window is inside one padded word when it
        # has no space strictly inside. Texts are separated by NUL, a character no term holds (code 0), so no
        # window that crosses texts is ever a term.
        parts = []
        for text in normalized:
            words = text.lower().split()
            parts.append(f" {' '.join(words)} " if words else "")
        joined = "\0".join(parts)
        codes = self._codes(joined)
        size = len(codes)
        text_of = np.repeat(np.arange(n_texts), [len(p) + 1 for p in parts])[:size]
        spaces_before = np.concatenate(([0], np.cumsum(codes == self._space)))  # spaces in codes[:i]
        found_terms, found_texts = [], []
        low, high = NGRAMS
        key = np.zeros(size, dtype=np.uint64)
        unknown = np.zeros(size, dtype=bool)
        for n in range(1, high + 1):
            count = size - n + 1
            if count <= 0:
                break
            shifted = codes[n - 1:n - 1 + count]
            key[:count] |= shifted << np.uint64(self.bits * (n - 1))
            unknown[:count] |= shifted == 0
            if n < low:
                continue
            inner = spaces_before[n - 1:n - 1 + count] - spaces_before[1:1 + count]  # spaces strictly inside
            ok = ~unknown[:count] & (inner == 0)
            cand = key[:count][ok] | np.uint64(n << _LENGTH_SHIFT)
            where, term = self._lookup(cand)
            found_terms.append(term)
            found_texts.append(text_of[:count][ok][where])
        terms = np.concatenate(found_terms) if found_terms else np.zeros(0, dtype=np.int64)
        if not len(terms):
            return out
        texts = np.concatenate(found_texts)
        width = len(self.idf)
        pairs, counts = np.unique(texts * width + terms, return_counts=True)
        text_ids, term_ids = pairs // width, pairs % width
        w = (1.0 + np.log(counts.astype(np.float64))) * self.idf[term_ids]
        dot = np.bincount(text_ids, weights=w * self.coef[term_ids], minlength=n_texts)
        norm = np.bincount(text_ids, weights=w * w, minlength=n_texts)
        has = norm > 0
        out[has] = dot[has] / np.sqrt(norm[has]) + self.intercept
        return out
