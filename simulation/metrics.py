"""Metrics shared by decision training and the load generator: percentiles, latency summaries and the
precision/recall/F1 of a spam/ham verdict against the simulation's ground truth (pure: no I/O)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from modpipe import schema


def percentile(values: Sequence[float], q: float) -> float | None:
    """q-th percentile (0..100), linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_summary(latencies_ms: Sequence[float]) -> dict:
    keys = {"p50_ms": 50, "p95_ms": 95, "p99_ms": 99}
    out = {k: round_or_none(percentile(latencies_ms, q)) for k, q in keys.items()}
    out["max_ms"] = round_or_none(max(latencies_ms)) if latencies_ms else None
    out["mean_ms"] = round_or_none(sum(latencies_ms) / len(latencies_ms)) if latencies_ms else None
    out["n"] = len(latencies_ms)
    return out


def binary_metrics(truth: Iterable[bool], predicted: Iterable[bool]) -> dict:
    """Precision, recall, F1 of the positive class (spam); None where the denominator is 0."""
    tp = fp = fn = tn = 0
    for t, p in zip(truth, predicted, strict=True):
        if t and p:
            tp += 1
        elif p:
            fp += 1
        elif t:
            fn += 1
        else:
            tn += 1
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else None  # = harmonic mean of precision and recall
    n = tp + fp + fn + tn
    return {"precision": round_or_none(precision, 4), "recall": round_or_none(recall, 4), "f1": round_or_none(f1, 4),
            "accuracy": round_or_none((tp + tn) / n, 4) if n else None,
            "false_positive_rate": round_or_none(fp / (fp + tn), 4) if fp + tn else None,
            "tp": tp, "fp": fp, "fn": fn, "tn": tn}


def confusion(pairs: Iterable[tuple[bool, str]]) -> dict:
    """{'spam': {'allow': n, 'review': n, 'block': n}, 'ham': {...}} from (is_spam, verdict) pairs."""
    out = {"spam": dict.fromkeys(schema.VERDICTS, 0), "ham": dict.fromkeys(schema.VERDICTS, 0)}
    for is_spam, verdict in pairs:
        out["spam" if is_spam else "ham"][verdict] += 1
    return out


def round_or_none(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(float(x), digits)
