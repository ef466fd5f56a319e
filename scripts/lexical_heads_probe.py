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
from sklearn.svm import LinearSVC
from stack_probe import held_out, report_stack
from tokenizers import Tokenizer

from modpipe.settings import Settings
from modpipe.textmodel import evaluate, lexical
from modpipe.textmodel.artifacts import resolve_model
from modpipe.textmodel.tokenize import BatchTokenizer

STACKS = {"transformer recalibrated": ["model"], "transformer + word (served)": ["model", "word"],
          "transformer + char": ["model", "char"], "transformer + word + char": ["model", "word", "char"],
          "word + char": ["word", "char"]}


def main() -> None:
    settings = Settings.from_env()
    build = resolve_model(settings)
    held = held_out(settings, build)
    norm = Tokenizer.from_file(str(build.path / "tokenizer.json")).normalizer.normalize_str
    tok = BatchTokenizer.for_build(build)
    texts = held.texts()
    proba = {k: evaluate.onnx_spam_proba(build.onnx, tok, t, desc=k) for k, t in texts.items()}
    heads = {"word": TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, token_pattern=lexical.TOKEN_PATTERN),
             "char": TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2)}
    margins: dict[str, dict[str, np.ndarray]] = {}
    for name, vec in heads.items():
        svm = LinearSVC(C=1.0, random_state=0).fit(vec.fit_transform([norm(e.text) for e in held.train]),
                                                   [e.label for e in held.train])
        margins[name] = {k: svm.decision_function(vec.transform([norm(x) for x in t])) for k, t in texts.items()}
        print(f"head {name}: {len(vec.vocabulary_):,} features")

    def features(cols: list[str], key: str) -> np.ndarray:
        return np.c_[tuple(lexical.model_logit(proba[key]) if c == "model" else margins[c][key] for c in cols)]

    for name, cols in STACKS.items():
        print(report_stack(name, lambda key, cols=cols: features(cols, key), held))


if __name__ == "__main__":
    main()
