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
window logit), `word` (the served build's lexical margin: a word head's on the build docs/text-model.md reports,
a character head's since). Texts of one window score the same in all three.
"""

from __future__ import annotations

import sys

import numpy as np
from stack_probe import held_out, report_stack
from tqdm import tqdm

from modpipe.settings import Settings
from modpipe.textmodel import lexical
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
    held = held_out(settings, build)
    stack = lexical.StackedScorer.load(str(build.path))
    scores: dict[str, dict[str, np.ndarray]] = {}
    for key, t in held.texts().items():
        first, last, most = window_logits(build, t, key)
        scores[key] = {"first": first, "last": last, "max": most, "word": stack.margins(t)}
    for name, cols in STACKS.items():
        print(report_stack(name, lambda key, cols=cols: np.c_[tuple(scores[key][c] for c in cols)], held))


if __name__ == "__main__":
    main()
