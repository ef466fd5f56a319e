"""`modpipe model eval --platforms`: a build on today's platform registers, held-out side, beside the baseline.

Per register of platforms.py, on its fixed test side (the non-commercial ones whole, less twins of trained
texts): the share of spam caught (recall) and the share of legitimate texts flagged, by the served model
(the build's stack) and by the TF-IDF + linear SVM baseline trained on the build's own train split; and the
targets: recall >= SPAM_RECALL_TARGET on the scam registers, flagged <= FLAGGED_TARGET on the legitimate
ones and never above the baseline's.
"""

from __future__ import annotations

import json

import numpy as np

from modpipe.textmodel import evaluate
from modpipe.textmodel.data import Example, text_hash

SPAM_RECALL_TARGET = 0.90
FLAGGED_TARGET = 0.02
RECALL_TARGETS = ("youtube", "instagram", "x_posts", "phishing_pot")
FLAGGED_TARGETS = ("tweeteval", "reviews", "airline", "instagram", "x_posts", "youtube")


def _share(flags: np.ndarray) -> float | None:
    return round(float(np.mean(flags)), 4) if len(flags) else None


def score(registers: list[str], labels: np.ndarray, model: np.ndarray, baseline: np.ndarray) -> dict:
    """Per register: n spam / ham, recall and flagged share of the model (probability >= 0.5) and the
    baseline (margin >= 0), and whether the targets hold. Pure: the scores are given."""
    regs = np.array(registers)
    out = {}
    for reg in sorted(set(registers)):
        m = regs == reg
        spam, ham = m & (labels == 1), m & (labels == 0)
        entry = {"spam": int(spam.sum()), "ham": int(ham.sum()),
                 "recall": {"model": _share(model[spam] >= 0.5), "baseline": _share(baseline[spam] >= 0)},
                 "flagged": {"model": _share(model[ham] >= 0.5), "baseline": _share(baseline[ham] >= 0)}}
        checks = {}
        if reg in RECALL_TARGETS and entry["spam"]:
            checks["recall"] = entry["recall"]["model"] >= SPAM_RECALL_TARGET
        if reg in FLAGGED_TARGETS and entry["ham"]:
            f = entry["flagged"]
            checks["flagged"] = f["model"] <= FLAGGED_TARGET and f["model"] <= f["baseline"]
        entry["targets"] = checks
        out[reg] = entry
    return out


def report(build, train: list[Example], rows: list) -> dict:
    """The held-out side of every platform register scored by `build` and by the baseline fitted on `train`
    (the build's train split). A held-out text whose normalised form is in `train` is left out (counted)."""
    trained = {e.key for e in train}
    held = [r for r in rows if r.side == "test"]
    test = [r for r in held if text_hash(r.text) not in trained]
    texts = [r.text for r in test]
    model = evaluate.served_spam_proba(build, texts, desc="platforms")
    baseline = evaluate.Baseline().fit(train).decision(texts)
    registers = score([r.register for r in test], np.array([r.label for r in test]), model, baseline)
    in_domain = {}
    metrics = build.path / "metrics.json"
    if metrics.exists():
        datasets = json.loads(metrics.read_text()).get("datasets", {})
        in_domain = {ds: {"model_f1": datasets[ds]["model"]["f1"], "baseline_f1": datasets[ds]["baseline"]["f1"]}
                     for ds in ("sms", "spamassassin") if ds in datasets}
    met = all(ok for entry in registers.values() for ok in entry["targets"].values())
    return {"model_dir": str(build.path), "version": build.served.get("version"),
            "trained_on_platforms": "platforms" in build.served, "split": "test side (platforms.side_of)",
            "held_out_in_train_dropped": len(held) - len(test), "baseline": evaluate.Baseline.DESCRIPTION,
            "targets": {"recall": {"registers": list(RECALL_TARGETS), "at_least": SPAM_RECALL_TARGET},
                        "flagged": {"registers": list(FLAGGED_TARGETS), "at_most": FLAGGED_TARGET,
                                    "and_not_above": "baseline"}},
            "registers": registers, "in_domain_test_f1": in_domain, "targets_met": met}


def format_report(result: dict) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:6.1f}%"

    lines = [f"{result['version']} at {result['model_dir']}; {result['split']}; trained on the platforms: "
             f"{result['trained_on_platforms']}; baseline = {result['baseline']}",
             f"{'register':<14}{'spam':>6}{'recall':>10}{'baseline':>10}{'ham':>7}{'flagged':>10}{'baseline':>10}"
             "   targets",
             "-" * 86]
    for reg, e in result["registers"].items():
        targets = " ".join(f"{k}:{'ok' if v else 'MISSED'}" for k, v in e["targets"].items())
        lines.append(f"{reg:<14}{e['spam']:>6}{pct(e['recall']['model']):>10}{pct(e['recall']['baseline']):>10}"
                     f"{e['ham']:>7}{pct(e['flagged']['model']):>10}{pct(e['flagged']['baseline']):>10}   {targets}")
    if result["in_domain_test_f1"]:
        lines.append("in-domain test spam F1 (metrics.json): " + json.dumps(result["in_domain_test_f1"]))
    lines.append(f"targets met: {result['targets_met']} (recall >= {SPAM_RECALL_TARGET:.0%} on "
                 f"{', '.join(RECALL_TARGETS)}; flagged <= {FLAGGED_TARGET:.0%} and <= the baseline's on "
                 f"{', '.join(FLAGGED_TARGETS)})")
    return "\n".join(lines)
