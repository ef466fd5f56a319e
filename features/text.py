"""`text_fingerprint`: one value for texts a reader would call "the same message".

Spam campaigns repost one message with trivial variations: case, spacing, a counter or a phone-number
digit changed, a different link, zero-width characters, fullwidth letters. Folding those before hashing
makes `user_post_count` count the campaign, not the byte string.
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
import unicodedata

# A whitespace token that is a URL: scheme://, www., or a bare `name.tld` host (optionally with a path).
# Matched per token, anchored at its start: a regex *searching* the whole text for URLs is quadratic on
# long unbroken strings (10k characters took seconds), which an attacker controls.
_URL_TOKEN_RE = re.compile(r"(?:[a-z][a-z0-9+.\-]*://|www\.|[a-z0-9\-]+(?:\.[a-z0-9\-]+)*\.[a-z]{2,}(?:[/:?#]|$))")
_PUNCT = "\"'()[]{}<>.,;:!?*"
_DIGITS_RE = re.compile(r"\d+")


@functools.cache
def _format_chars() -> re.Pattern:
    """A class of every format character (category Cf) of this Python's Unicode database: one C pass over a
    text instead of a lookup per character (a 10,000-character text took milliseconds). Built once, ~0.1 s.
    Written as ranges of consecutive code points: the class's characters outside the BMP (the tag block) are
    otherwise tested one by one at every position, 8.6x the time on the held-out non-ASCII texts."""
    runs: list[list[int]] = []
    for c in range(sys.maxunicode + 1):
        if unicodedata.category(chr(c)) == "Cf":
            if runs and runs[-1][1] == c - 1:
                runs[-1][1] = c
            else:
                runs.append([c, c])
    ranges = "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in runs)
    return re.compile(f"[{ranges}]+")


def normalise_text(text: str | None) -> str:
    if not text:
        return ""
    t = text
    if not t.isascii():  # NFKC and format characters concern non-ASCII text only
        t = unicodedata.normalize("NFKC", t)
        # Format chars (zero-width space/joiners, bidi marks) are invisible: drop them before anything else.
        t = _format_chars().sub("", t)
    # every URL form holds a "." or a ":": the other tokens skip the regex
    tokens = ["<url>" if ("." in tok or ":" in tok) and _URL_TOKEN_RE.match(tok.strip(_PUNCT)) else tok
              for tok in t.casefold().split()]
    return _DIGITS_RE.sub("0", " ".join(tokens))


def text_fingerprint(text: str | None) -> str:
    """Hex digest (32 chars) of `normalise_text(text)`; stable across processes and Python versions."""
    return hashlib.blake2b(normalise_text(text).encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
