"""`modpipe model eval --ood`: writing and spam the build never saw, beside the TF-IDF baseline.

The out-of-domain sources (`modpipe.textmodel.corpora.OOD_SOURCES`: newsgroup posts, news articles, product and
movie reviews, tweets, editorials, speeches, TV dialogue, mailing-list and other e-mail, and e-mail spam of
another collection) are read at evaluation time from their packages, with every text whose normalised form is
in the build's corpus dropped, and scored by the served model and by the baseline trained on the build's train
split. Reported per source at the served threshold (0.5 after the build's calibration) and the baseline's
(margin >= 0): the false-positive rate of a legitimate source, the recall of a spam source. The build records
the sha256 of every out-of-domain package it was built beside (`build.json` `ood_sources`); a package that
differs now is reported, not hidden. Out-of-domain spam is scarce in the registries this project can reach
(21 e-mails, modpipe/textmodel/corpora.py), so the in-domain test split's spam recall is reported beside it.
"""

from __future__ import annotations

import numpy as np

from modpipe.textmodel import data, evaluate
from modpipe.textmodel.data import Example

OOD_SEED = 0
FP_TARGET = 0.02  # overall false-positive rate on out-of-domain legitimate text
RECALL_TARGET = 0.90  # out-of-domain spam caught


def _rate(flags: np.ndarray) -> float | None:
    return round(float(np.mean(flags)), 4) if len(flags) else None


def report(build, train: list[Example], test: list[Example], cache_dir, before=None, seed: int = OOD_SEED) -> dict:
    """Per out-of-domain source: texts, and the model's, the baseline's (and `before`'s, another build scored
    on the same texts) false-positive rate on a legitimate source or recall on a spam source; overall; in-domain
    spam recall per data set of the test split."""
    texts, stats = data.ood_texts(cache_dir, seed, {e.key for e in train + test})
    baseline = evaluate.Baseline().fit(train)
    systems = {"model": build, **({"before": before} if before is not None else {})}
    sources: dict[str, dict] = {}
    flags: dict[int, dict[str, list[np.ndarray]]] = {label: {name: [] for name in (*systems, "baseline")}
                                                     for label in (0, 1)}
    for name, rows in texts.items():
        label = stats[name].get("label", 0)
        rate = "recall" if label else "fp"
        entry = {"texts": len(rows), **stats[name], "label": "spam" if label else "ham"}
        for system, b in systems.items():
            p = evaluate.served_spam_proba(b, rows, desc=f"ood {name} {system}")
            flags[label][system].append(p >= 0.5)
            entry[f"{system}_{rate}"] = _rate(p >= 0.5)
        margin = baseline.decision(rows)
        flags[label]["baseline"].append(margin >= 0.0)
        entry[f"baseline_{rate}"] = _rate(margin >= 0.0)
        sources[name] = entry
    overall = {f"{system}_fp": _rate(np.concatenate(f)) for system, f in flags[0].items()}
    overall.update({f"{system}_spam_recall": _rate(np.concatenate(f)) if f else None
                    for system, f in flags[1].items()})
    spam = [e for e in test if e.label == 1]
    p = evaluate.served_spam_proba(build, [e.text for e in spam], desc="spam")
    margin = baseline.decision([e.text for e in spam])
    recall = {ds: {"spam": len(idx), "model": _rate(p[idx] >= 0.5), "baseline": _rate(margin[idx] >= 0.0)}
              for ds, idx in evaluate.by_dataset(spam).items()}
    recorded = build.served.get("ood_sources") or {}
    now = data.ood_hashes(cache_dir)
    worse = [n for n, e in sources.items() if e["label"] == "ham" and e["model_fp"] > e["baseline_fp"]]
    targets = {"overall_fp": {"target": FP_TARGET, "value": overall["model_fp"],
                              "met": overall["model_fp"] <= FP_TARGET},
               "every_source_at_most_baseline": {"worse_sources": worse, "met": not worse}}
    if overall.get("model_spam_recall") is not None:
        targets["ood_spam_recall"] = {"target": RECALL_TARGET, "value": overall["model_spam_recall"],
                                      "spam_texts": sum(e["texts"] for e in sources.values() if e["label"] == "spam"),
                                      "met": overall["model_spam_recall"] >= RECALL_TARGET}
    return {"model_dir": str(build.path), "version": build.served.get("version"),
            "before": None if before is None else before.served.get("version"),
            "threshold": build.served.get("threshold"), "baseline": evaluate.Baseline.DESCRIPTION,
            "sources": sources, "overall": overall, "in_domain_spam_recall": recall,
            "packages": {"recorded_in_build": recorded, "now": now,
                         "changed": sorted(k for k in now if recorded and recorded.get(k) != now[k])},
            "targets": targets}


def format_report(result: dict) -> str:
    f = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    before = result["before"] is not None
    lines = []
    for label, rate, title in (("ham", "fp", "legitimate text: false positives"), ("spam", "recall", "spam: recall")):
        rows = [(n, e) for n, e in result["sources"].items() if e["label"] == label]
        if not rows:
            continue
        total = {"register": "", "texts": sum(e["texts"] for _, e in rows)}
        if label == "ham":
            total.update({k: v for k, v in result["overall"].items() if k.endswith("_fp")})
        else:
            total.update({k.replace("_spam_recall", "_recall"): v for k, v in result["overall"].items()
                          if k.endswith("_spam_recall")})
        lines += [f"out-of-domain {title} of {result['version']}" + (f" beside {result['before']}" if before else "")
                  + f" and the baseline ({result['baseline']})",
                  f"| source | register | texts | model | {'before | ' if before else ''}baseline |",
                  "|---|---|---|---|---|" + ("---|" if before else "")]
        for name, e in rows + [("overall", total)]:
            lines.append(f"| {name} | {e['register']} | {e['texts']} | {f(e[f'model_{rate}'])} | "
                         + (f"{f(e[f'before_{rate}'])} | " if before else "") + f"{f(e[f'baseline_{rate}'])} |")
    lines.append("in-domain spam recall (test split): " + ", ".join(
        f"{ds} {f(r['model'])} (baseline {f(r['baseline'])}, {r['spam']} texts)"
        for ds, r in result["in_domain_spam_recall"].items()))
    if result["packages"]["changed"]:
        lines.append("WARNING: packages differ from the ones recorded in the build (or were not recorded): "
                     f"{result['packages']['changed']}")
    for name, t in result["targets"].items():
        lines.append(f"target {name}: {'met' if t['met'] else 'NOT met'} "
                     f"({', '.join(f'{k}={v}' for k, v in t.items() if k != 'met')})")
    return "\n".join(lines)
