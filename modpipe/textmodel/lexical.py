"""The lexical head stacked on the text model: what a build serves as the text's spam probability.

The transformer and a TF-IDF + linear SVM make different errors: the transformer flags ordinary writing
about money, health and selling it never saw ("looks unlike SMS chat or a mailing list"), the lexical model
flags almost nothing outside its vocabulary but misses paraphrased spam. A logistic regression on the two
scores (the model's logit and the lexical model's margin), fitted on the validation split only, keeps what
each knows: docs/text-model.md has the numbers. The lexical model reads word 1-2 grams (`word`) or the
character 2-5 grams within each word (`char_wb`, what builds fit now: it generalises across spellings and
inflections the word model sees as unrelated terms).

The lexical model reads the text as the build's `tokenizer.json` normalises it, so the hostile-text folding
(look-alikes, spacing, leetspeak) applies to it as to the transformer.

Serving needs numpy and `tokenizers` only, never scikit-learn: the worker (streams/moderation/scoring.py), the
offline scorers (evaluate.served_spam_proba) and Triton's spam_postprocess (which gets this file copied
beside its model.py, so there is one implementation) all load `lexical_head.json` with `StackedScorer.load`.
scikit-learn is imported by `fit` alone, at build time. Keep this module free of modpipe imports.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

HEAD_FILE = "lexical_head.json"
# 1: word 1-2 grams only (the analyzer implied); 2: the analyzer named in the file
FORMAT = 2
READABLE_FORMATS = (1, 2)
# scikit-learn's default word pattern, which the head was fitted with: words of two or more word characters
TOKEN_PATTERN = r"(?u)\b\w\w+\b"
_TOKEN = re.compile(TOKEN_PATTERN)
# The model's probability is clipped before its logit is taken: what fitting and serving both do, so a
# saturated 1.0 from float32 gives the same logit (16.1) everywhere.
PROBA_CLIP = 1e-7


def terms(normalized: str) -> list[str]:
    """Word 1-grams and 2-grams of a normalised text, as scikit-learn's TfidfVectorizer(lowercase=True,
    ngram_range=(1, 2)) analyses it."""
    words = _TOKEN.findall(normalized.lower())
    return words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]


CHAR_NGRAMS = (2, 5)


def char_terms(normalized: str) -> list[str]:
    """Character 2- to 5-grams within each whitespace-separated word padded with one space either side, as
    scikit-learn's TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), lowercase=True) analyses it: a word
    no longer than n gives itself once and no longer n-grams."""
    low, high = CHAR_NGRAMS
    out: list[str] = []
    for word in normalized.lower().split():
        padded = f" {word} "
        size = len(padded)
        for n in range(low, high + 1):
            if size <= n:
                out.append(padded)
                break
            out.extend(padded[i:i + n] for i in range(size - n + 1))
    return out


ANALYZERS = {"word": terms, "char_wb": char_terms}


def model_logit(proba: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(proba, dtype=np.float64), PROBA_CLIP, 1 - PROBA_CLIP)
    return np.log(p / (1 - p))


class LexicalHead:
    """TF-IDF (sublinear tf, l2 norm) of `analyzer`'s terms (ANALYZERS) and a linear decision function, in numpy."""

    def __init__(self, vocabulary: Sequence[str], idf: np.ndarray, coef: np.ndarray, intercept: float,
                 analyzer: str = "word"):
        if analyzer not in ANALYZERS:
            raise ValueError(f"lexical head: analyzer {analyzer!r}, this code knows {sorted(ANALYZERS)}")
        self.analyzer = analyzer
        self._terms = ANALYZERS[analyzer]
        self.vocabulary = {term: i for i, term in enumerate(vocabulary)}
        self.idf = np.asarray(idf, dtype=np.float64)
        self.coef = np.asarray(coef, dtype=np.float64)
        self.intercept = float(intercept)
        if not len(self.vocabulary) == len(self.idf) == len(self.coef):
            raise ValueError(f"lexical head: {len(self.vocabulary)} terms, {len(self.idf)} idf values, "
                             f"{len(self.coef)} weights")

    def margin(self, normalized: str) -> float:
        counts: dict[int, int] = {}
        vocabulary = self.vocabulary
        for term, n in Counter(self._terms(normalized)).items():  # counted in C: a character head's terms repeat
            i = vocabulary.get(term)
            if i is not None:
                counts[i] = n
        if not counts:
            return self.intercept
        idx = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
        tf = 1.0 + np.log(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)))
        w = tf * self.idf[idx]
        return float(w @ self.coef[idx] / math.sqrt(float(w @ w))) + self.intercept

    def margins(self, normalized: Sequence[str]) -> np.ndarray:
        return np.array([self.margin(t) for t in normalized], dtype=np.float64)


class StackedScorer:
    """spam probability = sigmoid(a * model logit + b * lexical margin + c), c including the served shift."""

    def __init__(self, head: LexicalHead, model_coef: float, lexical_coef: float, intercept: float,
                 normalize=None, info: dict | None = None):
        self.head = head
        self.model_coef, self.lexical_coef, self.intercept = float(model_coef), float(lexical_coef), float(intercept)
        self._normalize = normalize or (lambda text: text)
        self.info = info or {}

    def normalized(self, texts: Sequence[str]) -> list[str]:
        return [self._normalize(t) for t in texts]

    def margins(self, texts: Sequence[str]) -> np.ndarray:
        """The lexical model's margin per raw text (normalised as the build's tokenizer does)."""
        return self.head.margins(self.normalized(texts))

    def decision(self, model_proba: np.ndarray, margins: np.ndarray) -> np.ndarray:
        return self.model_coef * model_logit(model_proba) + self.lexical_coef * np.asarray(margins) + self.intercept

    def spam_proba(self, texts: Sequence[str], model_proba: np.ndarray,
                   normalized: Sequence[str] | None = None) -> np.ndarray:
        """The served probability of each text from the transformer's probability of it. NaN stays NaN (the
        text model switched off or unavailable: the decision model reads the missing value). `normalized`: the
        texts as the build's tokenizer normalised them already (the worker's tokenizer hands them over), so the
        normaliser does not run twice."""
        model_proba = np.asarray(model_proba, dtype=np.float64)
        if len(texts) != len(model_proba):
            raise ValueError(f"{len(texts)} texts, {len(model_proba)} model probabilities")
        if normalized is not None and len(normalized) != len(texts):
            raise ValueError(f"{len(texts)} texts, {len(normalized)} normalised texts")
        margins = self.margins(texts) if normalized is None else self.head.margins(normalized)
        out = 1.0 / (1.0 + np.exp(-self.decision(model_proba, margins)))
        return np.where(np.isnan(model_proba), np.nan, out)

    def to_dict(self) -> dict:
        terms_by_index = sorted(self.head.vocabulary, key=self.head.vocabulary.__getitem__)
        analyzer = ({"kind": "word", "token_pattern": TOKEN_PATTERN, "ngram_range": [1, 2]}
                    if self.head.analyzer == "word" else {"kind": self.head.analyzer, "ngram_range": list(CHAR_NGRAMS)})
        return {"format": FORMAT,
                "analyzer": {**analyzer, "lowercase": True, "sublinear_tf": True, "norm": "l2",
                             "normalizer": "the build's tokenizer.json"},
                "stack": {"model_logit": self.model_coef, "lexical_margin": self.lexical_coef,
                          "intercept": self.intercept, **self.info},
                "head": {"intercept": self.head.intercept, "terms": terms_by_index,
                         # float32 precision keeps the file small; margins move by < 1e-6
                         "idf": [float(np.float32(v)) for v in self.head.idf],
                         "coef": [float(np.float32(v)) for v in self.head.coef]}}

    def save(self, directory: str) -> None:
        with open(os.path.join(directory, HEAD_FILE), "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f, ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def load(cls, directory: str, tokenizer_file: str = "tokenizer.json") -> StackedScorer | None:
        """The build's stack, or None for a build without one (it serves the transformer's probability)."""
        path = os.path.join(directory, HEAD_FILE)
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        if doc.get("format") not in READABLE_FORMATS:
            raise ValueError(f"{path}: format {doc.get('format')!r}, this code reads {READABLE_FORMATS}")
        from tokenizers import Tokenizer

        normalizer = Tokenizer.from_file(os.path.join(directory, tokenizer_file)).normalizer
        analyzer = doc.get("analyzer", {}).get("kind", "word") if doc["format"] >= 2 else "word"
        if analyzer == "char_wb" and doc["analyzer"].get("ngram_range") != list(CHAR_NGRAMS):
            raise ValueError(f"{path}: character n-grams {doc['analyzer'].get('ngram_range')}, this code reads "
                             f"{list(CHAR_NGRAMS)}")
        head = LexicalHead(doc["head"]["terms"], doc["head"]["idf"], doc["head"]["coef"], doc["head"]["intercept"],
                           analyzer=analyzer)
        stack = doc["stack"]
        info = {k: v for k, v in stack.items() if k not in ("model_logit", "lexical_margin", "intercept")}
        return cls(head, stack["model_logit"], stack["lexical_margin"], stack["intercept"],
                   normalize=normalizer.normalize_str if normalizer is not None else None, info=info)


def fit_head(normalized: Sequence[str], labels: Sequence[int], c: float = 1.0, analyzer: str = "word") -> LexicalHead:
    """TF-IDF + LinearSVC (scikit-learn, build time only), exported as a numpy `LexicalHead`. A character head
    keeps the n-grams of at least two training texts (min_df 2): one text's misspellings are noise."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.svm import LinearSVC

    if analyzer == "word":
        vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, lowercase=True, token_pattern=TOKEN_PATTERN)
    elif analyzer == "char_wb":
        vec = TfidfVectorizer(analyzer="char_wb", ngram_range=CHAR_NGRAMS, sublinear_tf=True, lowercase=True,
                              min_df=2)
    else:
        raise ValueError(f"lexical head: analyzer {analyzer!r}, this code knows {sorted(ANALYZERS)}")
    x = vec.fit_transform(list(normalized))
    svm = LinearSVC(C=c, random_state=0).fit(x, list(labels))  # seeded: its solver shuffles
    vocabulary = sorted(vec.vocabulary_, key=vec.vocabulary_.__getitem__)
    return LexicalHead(vocabulary, vec.idf_, svm.coef_[0], float(svm.intercept_[0]), analyzer=analyzer)


def fit_stack(head: LexicalHead, val_normalized: Sequence[str], val_labels: Sequence[int],
              val_model_proba: np.ndarray, normalize=None) -> StackedScorer:
    """A logistic regression on (model logit, lexical margin) of the validation split (build time only)."""
    from sklearn.linear_model import LogisticRegression

    x = np.c_[model_logit(val_model_proba), head.margins(val_normalized)]
    lr = LogisticRegression(C=1.0).fit(x, np.asarray(val_labels))
    return StackedScorer(head, lr.coef_[0][0], lr.coef_[0][1], lr.intercept_[0], normalize=normalize,
                         info={"fitted_on": f"validation split ({len(val_labels)} texts)"})
