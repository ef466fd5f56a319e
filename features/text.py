"""`text_fingerprint`: one value for texts a reader would call "the same message".

Spam campaigns repost one message with trivial variations: case, spacing, a counter or a phone-number
digit changed, a different link, zero-width characters, fullwidth letters. Folding those before hashing
makes `user_post_count` count the campaign, not the byte string.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

# URLs (with scheme or www.) and bare `name.tld/...` hosts; replaced by one placeholder token.
_URL_RE = re.compile(r"(?:[a-z][a-z0-9+.\-]*://|www\.)\S+|\b[a-z0-9\-]+(?:\.[a-z0-9\-]+)*\.[a-z]{2,}(?:/\S*)?",
                     re.IGNORECASE)
_DIGITS_RE = re.compile(r"\d+")
_SPACE_RE = re.compile(r"\s+")


def normalise_text(text: str | None) -> str:
    if not text:
        return ""
    t = unicodedata.normalize("NFKC", text)
    # Format chars (zero-width space/joiners, bidi marks) are invisible: drop them before anything else.
    t = "".join(ch for ch in t if unicodedata.category(ch) != "Cf")
    t = t.casefold()
    t = _URL_RE.sub(" <url> ", t)
    t = _DIGITS_RE.sub("0", t)
    return _SPACE_RE.sub(" ", t).strip()


def text_fingerprint(text: str | None) -> str:
    """Hex digest (32 chars) of `normalise_text(text)`; stable across processes and Python versions."""
    return hashlib.blake2b(normalise_text(text).encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
