"""Probe, not served: would stacking a lexical head on the served text model move issue #25's targets?

    .venv/bin/python scripts/stacking_probe.py [--skip-attacks]

The served build (`modpipe model build`, found as `modpipe model eval` finds it) gives a logit per text; the
lexical head is the TF-IDF + LinearSVC baseline of `modpipe model eval`, trained on the build's train split
but on the text as the build's tokenizer normalises it (so the hostile-text folding applies to it too); a
logistic regression on the two scores is fitted on the validation split only. Printed for the model alone,
the lexical head alone and the stack: test spam F1 per data set, the out-of-domain false-positive rate per
legitimate source and the out-of-domain spam recall (`modpipe model eval --ood`'s texts), and accuracy per
attack form at rate 1.0 (`modpipe model eval --robustness`'s texts). Every decision at score >= 0 (the
model's served threshold). Takes ~5 minutes on 2 cores, most of it the model on the attacked texts.
"""

from __future__ import annotations

import argparse

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from tokenizers import Tokenizer

from modpipe.settings import Settings
from modpipe.textmodel import data, evaluate, robustness
from modpipe.textmodel.artifacts import resolve_model
from modpipe.textmodel.tokenize import BatchTokenizer

DATASETS = ("sms", "spamassassin")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skip-attacks", action="store_true", help="leave out the attack table (the slow part)")
    args = parser.parse_args()
    settings = Settings.from_env()
    build = resolve_model(settings)
    corpus = data.load_corpus(settings.cache_dir, int(build.served.get("seed", 0)))
    train, val = corpus.splits["train"], corpus.splits["validation"]
    test = data.read_jsonl(build.path / "heldout.jsonl")
    tok = BatchTokenizer.for_build(build)
    normalizer = Tokenizer.from_file(str(build.path / "tokenizer.json")).normalizer

    def model(texts: list[str]) -> np.ndarray:
        """The served logit: the exported graph carries the build's calibration, so >= 0 is its threshold."""
        p = np.clip(evaluate.onnx_spam_proba(build.onnx, tok, texts), 1e-7, 1 - 1e-7)
        return np.log(p / (1 - p))

    lexical = evaluate.Baseline()
    lexical.pipe.fit([normalizer.normalize_str(e.text) for e in train], [e.label for e in train])

    def scores(texts: list[str]) -> dict[str, np.ndarray]:
        z, m = model(texts), lexical.pipe.decision_function([normalizer.normalize_str(t) for t in texts])
        return {"model": z, "lexical": m, "stack": stack.decision_function(np.c_[z, m])}

    yv = np.array([e.label for e in val])
    zv = model([e.text for e in val])
    mv = lexical.pipe.decision_function([normalizer.normalize_str(e.text) for e in val])
    stack = LogisticRegression(C=1.0).fit(np.c_[zv, mv], yv)
    print(f"build {build.version}; stack fitted on {len(val)} validation texts: "
          f"{stack.coef_[0][0]:.3f} * model logit + {stack.coef_[0][1]:.3f} * lexical margin "
          f"{stack.intercept_[0]:+.3f}")

    yt, dst = np.array([e.label for e in test]), np.array([e.dataset for e in test])
    clean = scores([e.text for e in test])
    print("\ntest spam F1      " + "  ".join(f"{ds:>12}" for ds in DATASETS))
    for system, s in clean.items():
        print(f"  {system:<16}" + "  ".join(f"{f1_score(yt[dst == ds], s[dst == ds] >= 0):12.4f}" for ds in DATASETS))

    texts, stats = data.ood_texts(settings.cache_dir, 0, {e.key for e in train + val + test})
    flagged: dict[str, dict[int, list[np.ndarray]]] = {s: {0: [], 1: []} for s in clean}
    print("\nout of domain     texts  " + "  ".join(f"{s:>8}" for s in clean) + "   (false-positive rate; spam: recall)")
    for name, rows in texts.items():
        label = stats[name].get("label", 0)
        s = scores(rows)
        for system in s:
            flagged[system][label].append(s[system] >= 0)
        print(f"  {name + (' (spam)' if label else ''):<20}{len(rows):>6}  " +
              "  ".join(f"{np.mean(s[system] >= 0):8.4f}" for system in s))
    print(f"  {'overall ham':<26}" + "  ".join(f"{np.mean(np.concatenate(flagged[s][0])):8.4f}" for s in clean))
    print(f"  {'overall spam recall':<26}" + "  ".join(f"{np.mean(np.concatenate(flagged[s][1])):8.4f}" for s in clean))

    if args.skip_attacks:
        return
    print(f"\naccuracy under attack (rate {robustness.ATTACK_RATE}, seed {robustness.ATTACK_SEED}): "
          "model / lexical / stack per data set")
    for form, attacked in robustness.attack_sets(test).items():
        s = clean if form == "clean" else scores(attacked)
        cells = ["/".join(f"{np.mean((s[system][dst == ds] >= 0) == yt[dst == ds]):.4f}" for system in s)
                 for ds in DATASETS]
        print(f"  {form:<12}" + "  ".join(f"{ds} {c}" for ds, c in zip(DATASETS, cells, strict=True)))


if __name__ == "__main__":
    main()
