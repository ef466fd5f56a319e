"""Obfuscation attacks: what a spammer does to a text to slip past a filter, generated on purpose.

Used three ways: training replaces a share of its examples (spam AND ham) by obfuscated variants, so that
"looks obfuscated" stops meaning "spam"; `modpipe model eval --robustness` attacks the test split with a
seed stream training never draws from; loadgen's `obfuscated_campaign` scenario disguises a campaign's texts.

Each form rewrites a share (`rate`) of a text's words of three or more letters; the rest stays as it was.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from modpipe.features.obfuscation import LEET, LEET_SYMBOLS, lookalikes_of
from modpipe.textmodel.data import Example

FORMS = ("leet", "lookalike", "spaced", "invisible", "synonym", "punctuation")
# How often training draws each form: the tokenizer undoes look-alikes, invisibles, inserted marks and spacing
# (hostile.py), so their variants teach little; leetspeak and synonyms are learned from examples alone (on a
# demo build with equal weights leetspeak still cost 6 points of accuracy, the other forms under 1).
TRAINING_WEIGHTS = (4, 1, 1, 1, 2, 1)  # in FORMS order
INVISIBLE = ("\u200b", "\u200c", "\u200d", "\u2060", "\u00ad", "\ufeff")
INSERTED_PUNCTUATION = ".-*_'`,"
# A small two-way list: spam's trigger words have plain synonyms, and ham uses both.
SYNONYMS: dict[str, tuple[str, ...]] = {
    "free": ("complimentary", "gratis", "no-cost"), "win": ("grab", "claim", "score"),
    "winner": ("champion", "lucky one"), "won": ("grabbed", "got"), "cash": ("money", "funds", "dough"),
    "money": ("cash", "funds", "dough"), "prize": ("reward", "award", "gift"), "call": ("ring", "phone", "dial"),
    "click": ("tap", "press", "hit"), "offer": ("deal", "promo", "bargain"), "buy": ("purchase", "order", "get"),
    "cheap": ("affordable", "low-cost", "discounted"), "urgent": ("important", "pressing", "time-critical"),
    "now": ("today", "asap", "right away"), "text": ("sms", "message", "msg"), "reply": ("respond", "answer"),
    "guaranteed": ("assured", "certain", "promised"), "credit": ("loan", "funding"), "txt": ("text", "msg"),
    "great": ("awesome", "excellent", "superb"), "good": ("nice", "fine", "decent"), "home": ("house", "place"),
    "week": ("wk", "7 days"), "mobile": ("phone", "cell"), "claim": ("collect", "redeem", "get"),
    "customer": ("client", "user"), "account": ("profile", "acct"), "price": ("cost", "rate"),
    "sale": ("clearance", "discount"), "order": ("purchase", "buy"), "stop": ("quit", "end"),
    "today": ("now", "tonight"), "service": ("support", "help"), "unsubscribe": ("opt out", "remove me"),
    "remove": ("delete", "take off"), "email": ("e-mail", "mail"), "save": ("keep", "cut costs"),
    "best": ("top", "finest"), "new": ("fresh", "latest"), "chance": ("opportunity", "shot"),
    "selected": ("chosen", "picked"), "congratulations": ("congrats", "well done"), "love": ("adore", "like"),
}
_WORD = re.compile(r"(\W*)([^\W\d_]{3,}|\w+)(\W*)")  # leading punctuation, core word, trailing punctuation


def _leet(word: str, rng: random.Random) -> str:
    out = []
    for ch in word:
        low = ch.lower()
        if low in LEET_SYMBOLS and rng.random() < 0.2:
            out.append(LEET_SYMBOLS[low])
        elif low in LEET and rng.random() < 0.8:
            out.append(LEET[low])
        else:
            out.append(ch)
    return "".join(out)


def _lookalike(word: str, rng: random.Random) -> str:
    table = lookalikes_of()
    return "".join(rng.choice(table[ch]) if ch in table and rng.random() < 0.6 else ch for ch in word)


def _spaced(word: str, rng: random.Random) -> str:
    sep = rng.choice("  .-*")
    return sep.join(word)


def _invisible(word: str, rng: random.Random) -> str:
    mark = rng.choice(INVISIBLE)
    return mark.join(word) if rng.random() < 0.5 else "".join(ch + (mark if rng.random() < 0.5 else "") for ch in word)


def _synonym(word: str, rng: random.Random) -> str:
    options = SYNONYMS.get(word.lower())
    if not options:
        return word
    out = rng.choice(options)
    return out.capitalize() if word[:1].isupper() else out


def _punctuation(word: str, rng: random.Random) -> str:
    cuts = sorted(rng.sample(range(1, len(word)), k=min(len(word) - 1, rng.choice((1, 1, 2)))))
    pieces, last = [], 0
    for c in cuts:
        pieces += [word[last:c], rng.choice(INSERTED_PUNCTUATION)]
        last = c
    return "".join(pieces + [word[last:]])


_REWRITE = {"leet": _leet, "lookalike": _lookalike, "spaced": _spaced, "invisible": _invisible,
            "synonym": _synonym, "punctuation": _punctuation}


def obfuscate(text: str, form: str, rng: random.Random, rate: float = 0.6) -> str:
    """`text` with about `rate` of its words of >= 3 letters rewritten by `form` (synonyms: every listed
    word with probability `rate`). Whitespace between words is kept as it was."""
    if form not in _REWRITE:
        raise ValueError(f"unknown attack form {form!r}; choose from {FORMS}")
    rewrite = _REWRITE[form]

    def one(m: re.Match) -> str:
        lead, core, trail = m.groups()
        if len(core) < 3 or not core.isalpha() or rng.random() >= rate:
            return m.group(0)
        return lead + rewrite(core, rng) + trail

    return re.sub(r"\S+", lambda tok: _WORD.sub(one, tok.group(0), count=1), text)


def variant(text: str, rng: random.Random) -> tuple[str, str]:
    """A random obfuscated variant for training: one form drawn by TRAINING_WEIGHTS (a quarter of the time
    two) at a random rate.
    Returns (text, form name; "a+b" for two)."""
    forms = [rng.choices(FORMS, weights=TRAINING_WEIGHTS)[0]]
    if rng.random() < 0.25:
        others = [f for f in FORMS if f != forms[0]]
        forms.append(rng.choices(others, weights=[TRAINING_WEIGHTS[FORMS.index(f)] for f in others])[0])
    for form in forms:
        text = obfuscate(text, form, rng, rate=rng.uniform(0.25, 1.0))
    return text, "+".join(forms)


def augment(examples: Sequence[Example], share: float, seed: int) -> tuple[list[Example], dict]:
    """Each example replaced by an obfuscated variant of itself with probability `share`, spam and ham alike
    (seeded: the same seed gives the same list). Returns (examples, {"replaced", "by_form", "by_label"})."""
    if share <= 0:
        return list(examples), {"replaced": 0, "by_form": {}, "by_label": {}}
    rng = random.Random(f"augment:{seed}")
    out, forms, labels = [], Counter(), Counter()
    for e in examples:
        if rng.random() < share:
            text, form = variant(e.text, rng)
            out.append(replace(e, text=text))
            forms[form.split("+")[0] if "+" not in form else "two forms"] += 1
            labels["spam" if e.label else "ham"] += 1
        else:
            out.append(e)
    return out, {"replaced": sum(forms.values()), "share": share, "seed_stream": f"augment:{seed}",
                 "by_form": dict(sorted(forms.items())), "by_label": dict(sorted(labels.items()))}


def attacked(texts: Sequence[str], form: str, seed: int, rate: float = 0.6) -> list[str]:
    """The test-time attack: every text through `form`, from a seed stream training never uses. Each text has its
    own stream (seeded by the text), so a text is disguised alike whatever texts come before it: two builds
    whose test splits hold the same texts in another order are attacked alike."""
    if form == "clean":
        return list(texts)
    return [obfuscate(t, form, random.Random(f"robustness:{form}:{seed}:{t}"), rate) for t in texts]
