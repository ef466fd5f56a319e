"""`modpipe model eval --robustness`: the served model and the TF-IDF baseline under obfuscation attacks.

Each attack form (attacks.FORMS) rewrites every test text of each data set trained on (not the platform registers
held out whole for their licence, platforms.EVAL_ONLY: 4,331 texts, 1,331 of them e-mails, that would double the
report's cost and measure registers no build learns), from a seed stream that training never draws from
("robustness:<form>:<seed>"; training draws from "augment:<seed>"). Reported per form and data set: accuracy
and spam metrics of the model and of the baseline, the gap to clean accuracy, and the clean-ham false-positive
rate; `--before DIR` puts another build (e.g. the one served before hardening) beside it on the same attacked
texts.
"""

from __future__ import annotations

import numpy as np

from modpipe.textmodel import attacks, evaluate
from modpipe.textmodel.data import Example
from modpipe.textmodel.platforms import EVAL_ONLY

ATTACK_SEED = 1123  # default seed of the test-time attacks
ATTACK_RATE = 1.0  # share of a text's words (>= 3 letters) each attack rewrites: spammers disguise every word
MAX_GAP = 0.03  # target: every attack within 3 accuracy points of clean, at full strength


def attack_sets(test: list[Example], seed: int = ATTACK_SEED, rate: float = ATTACK_RATE) -> dict[str, list[str]]:
    texts = [e.text for e in test]
    return {form: attacks.attacked(texts, form, seed, rate) for form in ("clean", *attacks.FORMS)}


def _per_dataset(test: list[Example], score: np.ndarray, threshold: float) -> dict:
    labels = np.array([e.label for e in test])
    out = {ds: evaluate.classification_metrics(labels[idx], score[idx], threshold)
           for ds, idx in evaluate.by_dataset(test).items()}
    out["all"] = evaluate.classification_metrics(labels, score, threshold)
    return out


def model_report(build, test: list[Example], sets: dict[str, list[str]]) -> dict:
    """Per form, per data set (and "all"): the build's metrics; gaps to clean accuracy; clean-ham FP rate."""
    # one call for every form: an attacked text the tokenizer turns back into its clean input is scored once
    every = [text for texts in sets.values() for text in texts]
    proba = iter(np.split(evaluate.served_spam_proba(build, every, desc="attacks"),
                          np.cumsum([len(texts) for texts in sets.values()])[:-1]))
    forms = {form: _per_dataset(test, next(proba), 0.5) for form in sets}
    return {"model_dir": str(build.path), "version": build.served.get("version"), "forms": forms,
            **summary(forms)}


def summary(forms: dict) -> dict:
    clean = forms["clean"]
    gaps = {form: {ds: round(clean[ds]["accuracy"] - m["accuracy"], 4) for ds, m in per.items()}
            for form, per in forms.items() if form != "clean"}
    fp_rate = {ds: round(m["confusion"]["fp"] / max(1, m["confusion"]["fp"] + m["confusion"]["tn"]), 4)
               for ds, m in clean.items()}
    worst = max((g for per in gaps.values() for g in per.values()), default=0.0)
    return {"accuracy_gap": gaps, "worst_gap": round(worst, 4), "clean_ham_false_positive_rate": fp_rate}


def baseline_report(train: list[Example], test: list[Example], sets: dict[str, list[str]]) -> dict:
    base = evaluate.Baseline().fit(train)
    forms = {form: _per_dataset(test, base.decision(texts), 0.0) for form, texts in sets.items()}
    return {"description": evaluate.Baseline.DESCRIPTION, "forms": forms, **summary(forms)}


def report(build, train: list[Example], test: list[Example], seed: int = ATTACK_SEED, rate: float = ATTACK_RATE,
           before=None) -> dict:
    test = [e for e in test if e.dataset not in EVAL_ONLY]
    sets = attack_sets(test, seed, rate)
    out = {"split": "test", "attack_seed": seed, "attack_rate": rate, "forms": list(sets),
           "targets": {"max_accuracy_gap": MAX_GAP},
           "model": model_report(build, test, sets), "baseline": baseline_report(train, test, sets)}
    if before is not None:
        out["before"] = model_report(before, test, sets)
        out["clean_ham_false_positive_rate"] = {"before": out["before"]["clean_ham_false_positive_rate"],
                                                "after": out["model"]["clean_ham_false_positive_rate"]}
    out["targets"]["met"] = out["model"]["worst_gap"] <= MAX_GAP
    return out


def format_report(result: dict) -> str:
    systems = [("model", result["model"]), ("baseline", result["baseline"])]
    if "before" in result:
        systems.insert(1, ("before", result["before"]))
    datasets = list(result["model"]["forms"]["clean"])
    lines = [f"attacks on the test split (seed {result['attack_seed']}, rate {result['attack_rate']}); "
             f"accuracy / spam F1 per data set; target: every attack within {MAX_GAP:.0%} of clean accuracy"]
    header = f"{'form':<13}{'system':<10}" + "".join(f"{ds:>22}" for ds in datasets)
    lines += [header, "-" * len(header)]
    for form in result["forms"]:
        for name, rep in systems:
            cells = "".join(f"{rep['forms'][form][ds]['accuracy']:>13.4f} / {rep['forms'][form][ds]['f1']:.4f}"
                            for ds in datasets)
            lines.append(f"{form:<13}{name:<10}{cells}")
    for name, rep in systems:
        lines.append(f"{name}: worst accuracy gap {rep['worst_gap']:.4f}; clean-ham false-positive rate "
                     + ", ".join(f"{ds} {v:.4f}" for ds, v in rep["clean_ham_false_positive_rate"].items()))
    lines.append(f"target met: {result['targets']['met']}")
    return "\n".join(lines)
