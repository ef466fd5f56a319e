"""Probe, not served: would another lexical head beside the transformer move issue #25's open targets?

    .venv/bin/python scripts/lexical_heads_probe.py

On the served build (found as `modpipe model eval` finds it), heads are fitted on the build's train split as
its tokenizer normalises the text, each stack (a logistic regression on the chosen scores) on the validation
split with its threshold chosen by `train.choose_shift` as the build chooses the served one, then scored on
the test split and the `--ood` texts: test spam F1 of SMS and SpamAssassin, the out-of-domain false-positive
rate overall, out-of-domain spam recall, and the legitimate sources flagged more than the TF-IDF baseline of
`modpipe model eval`. Heads: `word` (what the build serves, lexical.py) and `char` (TF-IDF of character
2-5 grams within word boundaries, min_df 2, + LinearSVC). The transformer's probabilities are computed once
(~14,000 texts, ~5 min on 2 cores).
"""

from __future__ import annotations

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from sklearn.svm import LinearSVC
from tokenizers import Tokenizer

from modpipe.settings import Settings
from modpipe.textmodel import data, evaluate, lexical, train
from modpipe.textmodel.artifacts import resolve_model
from modpipe.textmodel.tokenize import BatchTokenizer

STACKS = {"transformer recalibrated": ["model"], "transformer + word (served)": ["model", "word"],
          "transformer + char": ["model", "char"], "transformer + word + char": ["model", "word", "char"],
          "word + char": ["word", "char"]}


def main() -> None:
    settings = Settings.from_env()
    build = resolve_model(settings)
    corpus = data.load_corpus(settings.cache_dir, int(build.served.get("seed", 0)))
    tr, val = corpus.splits["train"], corpus.splits["validation"]
    test = data.read_jsonl(build.path / "heldout.jsonl")
    norm = Tokenizer.from_file(str(build.path / "tokenizer.json")).normalizer.normalize_str
    ood, stats = data.ood_texts(settings.cache_dir, 0, {e.key for e in tr + val + test})
    tok = BatchTokenizer.for_build(build)
    texts = {"val": [e.text for e in val], "test": [e.text for e in test], **{f"ood:{n}": r for n, r in ood.items()}}
    proba = {k: evaluate.onnx_spam_proba(build.onnx, tok, t, desc=k) for k, t in texts.items()}
    heads = {"word": TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, token_pattern=lexical.TOKEN_PATTERN),
             "char": TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2)}
    margins: dict[str, dict[str, np.ndarray]] = {}
    for name, vec in heads.items():
        svm = LinearSVC(C=1.0, random_state=0).fit(vec.fit_transform([norm(e.text) for e in tr]), [e.label for e in tr])
        margins[name] = {k: svm.decision_function(vec.transform([norm(x) for x in t])) for k, t in texts.items()}
        print(f"head {name}: {len(vec.vocabulary_):,} features")
    baseline = evaluate.Baseline().fit(tr)
    base_fp = {n: float(np.mean(baseline.decision(r) >= 0)) for n, r in ood.items() if not stats[n].get("label", 0)}
    yv, yt = np.array([e.label for e in val]), np.array([e.label for e in test])
    dt = np.array([e.dataset for e in test])
    groups, registers = train.validation_groups(val)

    def features(cols: list[str], key: str) -> np.ndarray:
        return np.c_[tuple(lexical.model_logit(proba[key]) if c == "model" else margins[c][key] for c in cols)]

    for name, cols in STACKS.items():
        lr = LogisticRegression(C=1.0).fit(features(cols, "val"), yv)
        shift, _ = train.choose_shift(lr.decision_function(features(cols, "val")), yv, groups, registers, 0.02)
        flagged = {k: lr.decision_function(features(cols, k)) + shift >= 0 for k in texts}
        f1 = {ds: round(f1_score(yt[dt == ds], flagged["test"][dt == ds]), 4) for ds in ("sms", "spamassassin")}
        ham = np.concatenate([flagged[f"ood:{n}"] for n in base_fp])
        spam = np.concatenate([flagged[f"ood:{n}"] for n in ood if n not in base_fp])
        worse = [f"{n} {flagged[f'ood:{n}'].mean():.3f} > {b:.3f}" for n, b in base_fp.items()
                 if flagged[f"ood:{n}"].mean() > b]
        print(f"{name:<30} test F1 {f1}  out-of-domain flagged {ham.mean():.4f}, spam recall {spam.mean():.2f}; "
              f"{len(worse)} sources above the baseline: {worse}")


if __name__ == "__main__":
    main()
