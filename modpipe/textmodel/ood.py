"""`modpipe model eval --ood`: legitimate writing the build never saw, beside the TF-IDF baseline.

The out-of-domain sources (`modpipe.textmodel.corpora.OOD_SOURCES`: newsgroup posts, news articles, product and movie
reviews, tweets, editorials, speeches, TV dialogue) are read at evaluation time from their packages, with
every text whose normalised form is in the build's corpus dropped, and scored by the served model and by
the baseline trained on the build's train split. Reported per source: the false-positive rate at the
served threshold (0.5 after the build's calibration) and the baseline's (margin >= 0). The build records
the sha256 of every out-of-domain package it was built beside (`build.json` `ood_sources`); a package that
differs now is reported, not hidden. Spam recall comes from the build's in-domain test split: no spam of
another kind ships in the registries this project can reach (modpipe/textmodel/corpora.py).
"""

from __future__ import annotations

import numpy as np

from modpipe.textmodel import data, evaluate
from modpipe.textmodel.data import Example
from modpipe.textmodel.tokenize import BatchTokenizer

OOD_SEED = 0
FP_TARGET = 0.02  # overall false-positive rate on out-of-domain legitimate text


def _rate(flags: np.ndarray) -> float | None:
    return round(float(np.mean(flags)), 4) if len(flags) else None


def report(build, train: list[Example], test: list[Example], cache_dir, before=None, seed: int = OOD_SEED) -> dict:
    """Per out-of-domain source: texts, model and baseline false-positive rates (and `before`'s, another
    build scored on the same texts); overall; in-domain spam recall per data set of the test split."""
    texts, stats = data.ood_texts(cache_dir, seed, {e.key for e in train + test})
    baseline = evaluate.Baseline().fit(train)
    systems = {"model": build, **({"before": before} if before is not None else {})}
    sources: dict[str, dict] = {}
    flags: dict[str, list[np.ndarray]] = {name: [] for name in (*systems, "baseline")}
    for name, rows in texts.items():
        entry = {"texts": len(rows), **stats[name]}
        for label, b in systems.items():
            p = evaluate.onnx_spam_proba(b.onnx, BatchTokenizer.for_build(b), rows, desc=f"ood {name} {label}")
            flags[label].append(p >= 0.5)
            entry[f"{label}_fp"] = _rate(p >= 0.5)
        margin = baseline.decision(rows)
        flags["baseline"].append(margin >= 0.0)
        entry["baseline_fp"] = _rate(margin >= 0.0)
        sources[name] = entry
    overall = {f"{label}_fp": _rate(np.concatenate(f)) for label, f in flags.items()}
    spam = [e for e in test if e.label == 1]
    p = evaluate.onnx_spam_proba(build.onnx, BatchTokenizer.for_build(build), [e.text for e in spam], desc="spam")
    margin = baseline.decision([e.text for e in spam])
    recall = {ds: {"spam": len(idx), "model": _rate(p[idx] >= 0.5), "baseline": _rate(margin[idx] >= 0.0)}
              for ds, idx in evaluate.by_dataset(spam).items()}
    recorded = build.served.get("ood_sources") or {}
    now = data.ood_hashes(cache_dir)
    worse = [n for n, e in sources.items() if e["model_fp"] > e["baseline_fp"]]
    return {"model_dir": str(build.path), "version": build.served.get("version"),
            "before": None if before is None else before.served.get("version"),
            "threshold": build.served.get("threshold"), "baseline": evaluate.Baseline.DESCRIPTION,
            "sources": sources, "overall": overall, "in_domain_spam_recall": recall,
            "packages": {"recorded_in_build": recorded, "now": now,
                         "changed": sorted(k for k in now if recorded and recorded.get(k) != now[k])},
            "targets": {"overall_fp": {"target": FP_TARGET, "value": overall["model_fp"],
                                       "met": overall["model_fp"] <= FP_TARGET},
                        "every_source_at_most_baseline": {"worse_sources": worse, "met": not worse}}}


def format_report(result: dict) -> str:
    f = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    before = result["before"] is not None
    lines = [f"out-of-domain legitimate text: false positives of {result['version']}"
             + (f" beside {result['before']}" if before else "") + f" and the baseline ({result['baseline']})",
             f"| source | register | texts | model FP | {'before FP | ' if before else ''}baseline FP |",
             "|---|---|---|---|---|" + ("---|" if before else "")]
    for name, e in list(result["sources"].items()) + [("overall", {**result["overall"], "register": "",
                                                                    "texts": sum(s["texts"] for s in
                                                                                 result["sources"].values())})]:
        lines.append(f"| {name} | {e['register']} | {e['texts']} | {f(e['model_fp'])} | "
                     + (f"{f(e['before_fp'])} | " if before else "") + f"{f(e['baseline_fp'])} |")
    lines.append("in-domain spam recall (test split): " + ", ".join(
        f"{ds} {f(r['model'])} (baseline {f(r['baseline'])}, {r['spam']} texts)"
        for ds, r in result["in_domain_spam_recall"].items()))
    if result["packages"]["changed"]:
        lines.append(f"WARNING: packages differ from the ones recorded in the build: {result['packages']['changed']}")
    for name, t in result["targets"].items():
        lines.append(f"target {name}: {'met' if t['met'] else 'NOT met'} "
                     f"({', '.join(f'{k}={v}' for k, v in t.items() if k != 'met')})")
    return "\n".join(lines)
