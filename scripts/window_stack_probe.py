"""Probe, not served: would the transformer reading more of a long text than its first window move issue #25?

    .venv/bin/python scripts/window_stack_probe.py

The served build reads a text's first 128 tokens; its lexical head reads the whole text. SpamAssassin errors are
mostly spam whose first window reads like a mailing-list post. On the served build (found as `modpipe model eval`
finds it), with its own transformer and its own lexical head (lexical_head.json), this scores every window of a
text (the text cut into 126-token pieces, each between [CLS] and [SEP], at most `MAX_WINDOWS`), and fits stacks
(a logistic regression on the chosen scores) on the validation split with the threshold chosen by
`train.choose_shift` as the build chooses the served one; then test spam F1 of SMS and SpamAssassin, the
out-of-domain false-positive rate overall, out-of-domain spam recall, and the legitimate sources flagged more
than the TF-IDF baseline. Scores: `first` (what is served), `last` (the last window), `max` (the largest
window logit), `word` (the served lexical margin). Texts of one window score the same in all three.
"""

from __future__ import annotations

import sys

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score
from tqdm import tqdm

from modpipe.settings import Settings
from modpipe.textmodel import data, evaluate, lexical, train
from modpipe.textmodel.artifacts import resolve_model
from modpipe.textmodel.export import ort_session
from modpipe.textmodel.tokenize import BatchTokenizer

MAX_WINDOWS = 8
STACKS = {"first + word (served)": ["first", "word"], "last + word": ["last", "word"],
          "first + last + word": ["first", "last", "word"], "max + word": ["max", "word"],
          "first + max + word": ["first", "max", "word"]}


def windows(ids: list[int], width: int, cls: int, sep: int) -> list[list[int]]:
    """The text's tokens (without its [CLS]/[SEP]) in consecutive pieces of `width - 2`, each wrapped."""
    body = ids[1:-1] if len(ids) >= 2 else ids
    step = width - 2
    pieces = [body[i:i + step] for i in range(0, max(len(body), 1), step)][:MAX_WINDOWS]
    return [[cls, *p, sep] for p in pieces]


def window_logits(build, texts: list[str], desc: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(first, last, max) window logit per text."""
    tok = BatchTokenizer.for_build(build)
    full = BatchTokenizer(build.tokenizer, max_len=10**6, tail=1)  # tail > 0: no truncation
    cls, sep = full._tok.token_to_id("[CLS]"), full._tok.token_to_id("[SEP]")
    per_text = [windows(seq, tok.max_len, cls, sep) for seq in full.ids(texts)]
    row_of: dict[tuple[int, ...], int] = {}
    rows = [[row_of.setdefault(tuple(w), len(row_of)) for w in ws] for ws in per_text]
    inputs = list(row_of)
    order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
    sess = ort_session(build.onnx, 2)
    logit = np.zeros(len(inputs))
    for start in tqdm(range(0, len(order), 32), desc=desc, unit="batch", file=sys.stderr):
        batch = order[start:start + 32]
        ids, mask = tok.pad([inputs[i] for i in batch])
        out = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask})[0].astype(np.float64)
        p = np.exp(out - out.max(axis=1, keepdims=True))
        logit[batch] = lexical.model_logit(p[:, 1] / p.sum(axis=1))
    first = np.array([logit[r[0]] for r in rows])
    last = np.array([logit[r[-1]] for r in rows])
    most = np.array([logit[r].max() for r in rows])
    print(f"{desc}: {len(texts):,} texts, {len(inputs):,} windows, {sum(len(r) > 1 for r in rows):,} texts of "
          "more than one", file=sys.stderr)
    return first, last, most


def main() -> None:
    settings = Settings.from_env()
    build = resolve_model(settings)
    corpus = data.load_corpus(settings.cache_dir, int(build.served.get("seed", 0)))
    tr, val = corpus.splits["train"], corpus.splits["validation"]
    test = data.read_jsonl(build.path / "heldout.jsonl")
    stack = lexical.StackedScorer.load(str(build.path))
    ood, stats = data.ood_texts(settings.cache_dir, 0, {e.key for e in tr + val + test})
    texts = {"val": [e.text for e in val], "test": [e.text for e in test], **{f"ood:{n}": r for n, r in ood.items()}}
    scores: dict[str, dict[str, np.ndarray]] = {}
    for key, t in texts.items():
        first, last, most = window_logits(build, t, key)
        scores[key] = {"first": first, "last": last, "max": most, "word": stack.margins(t)}
    baseline = evaluate.Baseline().fit(tr)
    base_fp = {n: float(np.mean(baseline.decision(r) >= 0)) for n, r in ood.items() if not stats[n].get("label", 0)}
    yv, yt = np.array([e.label for e in val]), np.array([e.label for e in test])
    dt = np.array([e.dataset for e in test])
    groups, registers = train.validation_groups(val)

    def features(cols: list[str], key: str) -> np.ndarray:
        return np.c_[tuple(scores[key][c] for c in cols)]

    for name, cols in STACKS.items():
        lr = LogisticRegression(C=1.0).fit(features(cols, "val"), yv)
        val_margin = lr.decision_function(features(cols, "val"))
        shift, _ = train.choose_shift(val_margin, yv, groups, registers, 0.02)
        flagged = {k: lr.decision_function(features(cols, k)) + shift >= 0 for k in texts}
        vf1 = {ds: round(f1_score(yv[m], flagged["val"][m]), 4) for ds, m in groups.items()}
        reg = max(flagged["val"][m].mean() for m in registers.values())
        f1 = {ds: round(f1_score(yt[dt == ds], flagged["test"][dt == ds]), 4) for ds in ("sms", "spamassassin")}
        errors = {ds: int((flagged["test"][dt == ds] != yt[dt == ds]).sum()) for ds in ("sms", "spamassassin")}
        ham = np.concatenate([flagged[f"ood:{n}"] for n in base_fp])
        spam = np.concatenate([flagged[f"ood:{n}"] for n in ood if n not in base_fp])
        worse = [f"{n} {flagged[f'ood:{n}'].sum()} > {round(b * len(ood[n]))}" for n, b in base_fp.items()
                 if flagged[f"ood:{n}"].mean() > b]
        print(f"{name:<24} coef {np.round(lr.coef_[0], 2).tolist()} shift {shift:+.1f} | validation F1 {vf1}, "
              f"worst register {reg:.3f} | test F1 {f1} errors {errors} | out-of-domain flagged {ham.sum()} "
              f"({ham.mean():.4f}), spam recall {spam.mean():.2f}; above the baseline: {worse}")


if __name__ == "__main__":
    main()
