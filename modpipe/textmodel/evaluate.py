"""Evaluation of a build (ONNX Runtime, per-batch padding; the lexical stack on top) beside a TF-IDF + LinearSVC
baseline."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from modpipe import log
from modpipe.output import progress_bar
from modpipe.textmodel.data import Example
from modpipe.textmodel.tokenize import BatchTokenizer

_log = log.get(__name__)

METRIC_KEYS = ("accuracy", "precision", "recall", "f1", "roc_auc")


def classification_metrics(labels: Sequence[int], score: Sequence[float], threshold: float) -> dict:
    """Spam-class metrics; `score` is a spam probability or margin, spam when score >= threshold."""
    from sklearn.metrics import (
        accuracy_score,
        confusion_matrix,
        f1_score,
        precision_score,
        recall_score,
        roc_auc_score,
    )

    y = np.asarray(labels, dtype=int)
    s = np.asarray(score, dtype=float)
    pred = (s >= threshold).astype(int)
    tn, fp, fn, tp = confusion_matrix(y, pred, labels=[0, 1]).ravel()
    return {
        "n": int(len(y)), "spam": int(y.sum()),
        "accuracy": round(float(accuracy_score(y, pred)), 4),
        "precision": round(float(precision_score(y, pred, zero_division=0)), 4),
        "recall": round(float(recall_score(y, pred, zero_division=0)), 4),
        "f1": round(float(f1_score(y, pred, zero_division=0)), 4),
        "roc_auc": round(float(roc_auc_score(y, s)), 4) if 0 < y.sum() < len(y) else None,
        "confusion": {"tn": int(tn), "fp": int(fp), "fn": int(fn), "tp": int(tp)},
    }


def onnx_spam_proba(onnx_path: Path, tok: BatchTokenizer, texts: Sequence[str], batch_size: int = 32,
                    threads: int = 2, desc: str | None = None, progress: bool = True) -> np.ndarray:
    """Spam probability per text with ONNX Runtime; batches of similar length, each padded to its longest.

    Each distinct model input is scored once: texts the tokenizer makes alike (most obfuscation attacks
    are undone by its normaliser, so `--robustness` scores ~46% fewer inputs than texts) and repeated posts
    share one row, as they share one entry of the worker's text cache."""
    from modpipe.textmodel.export import ort_session

    sess = ort_session(onnx_path, threads)
    row_of_input: dict[tuple[int, ...], int] = {}
    rows_of_texts = np.array([row_of_input.setdefault(tuple(seq), len(row_of_input)) for seq in tok.ids(texts)],
                             dtype=np.int64)
    inputs = list(row_of_input)
    order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
    out = np.zeros(len(inputs), dtype=np.float64)
    for start in progress_bar(range(0, len(order), batch_size), desc=desc or f"eval {Path(onnx_path).name}",
                              unit="batch", leave=False, enabled=progress):
        rows = order[start:start + batch_size]
        ids, mask = tok.pad([inputs[i] for i in rows])
        logits = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0].astype(np.float64)
        z = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        out[rows] = p[:, 1]
    return out[rows_of_texts]


def served_spam_proba(build, texts: Sequence[str], desc: str | None = None, threads: int = 2,
                      progress: bool = True) -> np.ndarray:
    """The probability a build serves: the transformer's, through the build's lexical stack when it has one
    (lexical.py; builds before it serve the transformer alone)."""
    texts = list(texts)
    proba = onnx_spam_proba(build.onnx, BatchTokenizer.for_build(build), texts, threads=threads, desc=desc,
                            progress=progress)
    stack = build.stack()
    return proba if stack is None else stack.spam_proba(texts, proba)


class Baseline:
    """TF-IDF (word 1-2 grams, sublinear tf) + LinearSVC (C=1), trained on the same train split."""

    DESCRIPTION = "TF-IDF (word 1-2 grams, sublinear tf, lowercase) + LinearSVC (C=1)"

    def __init__(self, c: float = 1.0):
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.pipeline import make_pipeline
        from sklearn.svm import LinearSVC

        self.pipe = make_pipeline(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, lowercase=True),
                                  LinearSVC(C=c))

    def fit(self, examples: list[Example]) -> Baseline:
        self.pipe.fit([e.text for e in examples], [e.label for e in examples])
        return self

    def decision(self, texts: Sequence[str]) -> np.ndarray:
        return self.pipe.decision_function(list(texts))


def by_dataset(examples: list[Example]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        out.setdefault(e.dataset, []).append(i)
    return dict(sorted(out.items()))


def evaluate(onnx_path: Path, tok: BatchTokenizer, train: list[Example], test: list[Example],
             baseline: Baseline | None = None, stack=None) -> dict:
    """Per data set on `test`: the served model, the transformer alone when a lexical `stack` serves it
    (lexical.StackedScorer), and the baseline, side by side."""
    texts = [e.text for e in test]
    transformer = onnx_spam_proba(onnx_path, tok, texts, desc="eval model")
    systems = {"model": transformer if stack is None else stack.spam_proba(texts, transformer)}
    if stack is not None:
        systems["transformer"] = transformer
    baseline = baseline or Baseline().fit(train)
    margin = baseline.decision(texts)
    labels = [e.label for e in test]
    result = {}
    for ds, idx in by_dataset(test).items():
        y = [labels[i] for i in idx]
        result[ds] = {**{name: classification_metrics(y, p[idx], 0.5) for name, p in systems.items()},
                      "baseline": classification_metrics(y, margin[idx], 0.0)}
    return result


def format_table(datasets: dict) -> str:
    lines = []
    header = f"{'dataset':<14}{'system':<12}" + "".join(f"{k:>10}" for k in METRIC_KEYS) + "   confusion (tn fp fn tp)"
    lines.append(header)
    lines.append("-" * len(header))
    for ds, entry in datasets.items():
        for system in (s for s in ("model", "transformer", "baseline") if s in entry):
            m = entry[system]
            vals = "".join(f"{m[k]:>10.4f}" if m[k] is not None else f"{'-':>10}" for k in METRIC_KEYS)
            c = m["confusion"]
            lines.append(f"{ds:<14}{system:<12}{vals}   {c['tn']} {c['fp']} {c['fn']} {c['tp']}")
    return "\n".join(lines)
