"""What the stack probes share (`lexical_heads_probe.py`, `window_stack_probe.py`): the served build's held-out
texts and out-of-domain texts, and one stack fitted on validation and scored as the build would serve it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score

from modpipe.textmodel import data, evaluate, train


@dataclass
class HeldOut:
    train: list
    validation: list
    test: list
    ood: dict[str, list[str]]
    baseline_fp: dict[str, float]  # the TF-IDF baseline's false-positive rate per legitimate out-of-domain source

    def texts(self) -> dict[str, list[str]]:
        """Every text a stack is scored on: "val", "test" and "ood:<source>"."""
        return {"val": [e.text for e in self.validation], "test": [e.text for e in self.test],
                **{f"ood:{n}": r for n, r in self.ood.items()}}


def held_out(settings, build) -> HeldOut:
    corpus = data.load_corpus(settings.cache_dir, int(build.served.get("seed", 0)))
    tr, val = corpus.splits["train"], corpus.splits["validation"]
    test = data.read_jsonl(build.path / "heldout.jsonl")
    ood, stats = data.ood_texts(settings.cache_dir, 0, {e.key for e in tr + val + test})
    baseline = evaluate.Baseline().fit(tr)
    base_fp = {n: float(np.mean(baseline.decision(r) >= 0)) for n, r in ood.items() if not stats[n].get("label", 0)}
    return HeldOut(tr, val, test, ood, base_fp)


def report_stack(name: str, features: Callable[[str], np.ndarray], held: HeldOut) -> str:
    """A logistic regression on `features(key)` fitted on validation, its threshold chosen by
    `train.choose_shift` as the build chooses the served one; one line of what it scores."""
    yv, yt = np.array([e.label for e in held.validation]), np.array([e.label for e in held.test])
    dt = np.array([e.dataset for e in held.test])
    groups, registers = train.validation_groups(held.validation)
    x_val = features("val")
    lr = LogisticRegression(C=1.0).fit(x_val, yv)
    shift, _ = train.choose_shift(lr.decision_function(x_val), yv, groups, registers, 0.02)
    flagged = {k: lr.decision_function(features(k)) + shift >= 0 for k in held.texts()}
    vf1 = {ds: round(f1_score(yv[m], flagged["val"][m]), 4) for ds, m in groups.items()}
    worst = max((flagged["val"][m].mean() for m in registers.values()), default=0.0)
    f1 = {ds: round(f1_score(yt[dt == ds], flagged["test"][dt == ds]), 4) for ds in ("sms", "spamassassin")}
    errors = {ds: int((flagged["test"][dt == ds] != yt[dt == ds]).sum()) for ds in ("sms", "spamassassin")}
    ham = np.concatenate([flagged[f"ood:{n}"] for n in held.baseline_fp])
    spam = np.concatenate([flagged[f"ood:{n}"] for n in held.ood if n not in held.baseline_fp])
    worse = [f"{n} {flagged[f'ood:{n}'].sum()} > {round(b * len(held.ood[n]))}" for n, b in held.baseline_fp.items()
             if flagged[f"ood:{n}"].mean() > b]
    return (f"{name:<30} coef {np.round(lr.coef_[0], 2).tolist()} shift {shift:+.1f} | validation F1 {vf1}, worst "
            f"register {worst:.3f} | test F1 {f1} errors {errors} | out-of-domain flagged {ham.sum()} "
            f"({ham.mean():.4f}), spam recall {spam.mean():.2f}; {len(worse)} sources above the baseline: {worse}")
