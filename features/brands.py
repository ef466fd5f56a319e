"""Lookalikes of well-known brand domains: `paypa1.com`, `g00gle.com`, `micr.osoftr.com`, `pаypal.com`.

Both sides go through the same *skeleton* (homoglyphs, leetspeak digits and `rn`->`m` folded, accents
dropped) and are compared by edit distance with a length-dependent budget: short brand names allow only
exact skeleton matches, or `ups`/`visa` would match half the web.
"""

from __future__ import annotations

import dataclasses
import unicodedata

from modpipe.features.lists import BRAND_DOMAINS
from modpipe.features.url import UrlInfo

from modpipe import memory

# Confusable letters (Cyrillic, Greek, Latin variants) and leetspeak digits, folded to one latin letter.
# i/l/1/| all fold to "l" because they are what a reader cannot tell apart in most fonts.
_CONFUSABLES = str.maketrans({
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "l", "ј": "j", "ѕ": "s",
    "һ": "h", "ԁ": "d", "ɡ": "g", "ӏ": "l", "ԛ": "q", "ԝ": "w", "ν": "v", "ο": "o", "α": "a", "ε": "e",
    "ι": "l", "κ": "k", "ρ": "p", "τ": "t", "υ": "u", "χ": "x", "ı": "l", "ł": "l", "ø": "o", "ß": "b",
    "0": "o", "1": "l", "i": "l", "|": "l", "!": "l", "3": "e", "4": "a", "@": "a", "5": "s", "$": "s",
    "7": "t", "8": "b", "9": "g", "6": "b",
})
_MULTI = (("rn", "m"), ("vv", "w"), ("cl", "d"))


def skeleton(s: str) -> str:
    s = unicodedata.normalize("NFKD", s.lower())
    s = "".join(ch for ch in s if not unicodedata.combining(ch))
    s = s.translate(_CONFUSABLES).replace("-", "").replace(".", "").replace("_", "")
    for a, b in _MULTI:
        s = s.replace(a, b)
    return s


def _core(domain: str) -> str:
    return domain.split(".", 1)[0]


@dataclasses.dataclass(frozen=True)
class _Brand:
    domain: str
    core: str
    skel: str
    budget: int  # edit operations allowed between skeletons


def _budget(core: str) -> int:
    return 2 if len(core) >= 9 else 1 if len(core) >= 6 else 0


MAX_EDITS = 3  # one more than the largest budget: beyond it the exact distance carries no signal

BRANDS: tuple[_Brand, ...] = tuple(_Brand(d, _core(d), skeleton(_core(d)), _budget(_core(d))) for d in BRAND_DOMAINS)
_BRAND_SET = frozenset(BRAND_DOMAINS)


@dataclasses.dataclass(frozen=True)
class BrandMatch:
    brand: str | None = None  # the brand domain matched (owned, other TLD, lookalike or in host)
    owned: bool = False  # the link is on the brand's own registrable domain
    lookalike: bool = False  # skeleton within the edit budget, but not the brand's spelling
    other_tld: bool = False  # exact brand name under another suffix (`paypal.xyz`)
    in_host: bool = False  # brand name as a label/hyphen token of a foreign host (`paypal.com.evil.net`)
    edits: int | None = None  # min skeleton edit distance to any brand, capped at MAX_EDITS (= "far")


def levenshtein(a: str, b: str, limit: int | None = None) -> int:
    """Edit distance; with `limit`, returns limit+1 as soon as the distance must exceed it."""
    if len(a) < len(b):
        a, b = b, a
    if limit is not None and len(a) - len(b) > limit:
        return limit + 1
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        if limit is not None and min(cur) > limit:
            return limit + 1
        prev = cur
    return prev[-1]


def brand_match(info: UrlInfo) -> BrandMatch:
    if not info.valid or info.is_ip or not info.domain:
        return BrandMatch()
    return _match(info.host_unicode or info.host, info.domain, info.tld or "")


@memory.cached("brand_match", size=memory.record_entry_size)
def _match(host_unicode: str, domain: str, tld: str) -> BrandMatch:
    if domain in _BRAND_SET:
        return BrandMatch(brand=domain, owned=True, edits=0)
    # Labels left of the public suffix, unicode form (homoglyphs are visible only there), minus `www`.
    labels = host_unicode.split(".")
    n_suffix = tld.count(".") + 1 if tld else 1
    own = [lb for lb in labels[:-n_suffix] if lb] or labels[:1]
    if own and own[0] == "www" and len(own) > 1:
        own = own[1:]
    core = own[-1]
    tokens = {t for lb in own for t in lb.replace("_", "-").split("-") if t}
    # Candidate spellings: the domain label, all own labels joined (`micr.osoftr` reads `microsoftr`),
    # and hyphen tokens (`faceb00k-login`). Pairs of (as written, skeleton).
    raws = {core, "".join(own)} | {t for t in tokens if len(t) >= 4}
    candidates = {(raw, skeleton(raw)) for raw in raws}
    best, best_brand = MAX_EDITS, None
    lookalike_brand = other_tld_brand = in_host_brand = None
    for b in BRANDS:
        if core == b.core:
            other_tld_brand = other_tld_brand or b.domain
        elif len(b.core) >= 3 and b.core in tokens:
            in_host_brand = in_host_brand or b.domain
        for raw, skel in candidates:
            limit = max(best - 1, b.budget)
            if abs(len(skel) - len(b.skel)) > limit:
                continue  # the length difference alone exceeds anything we still care about
            d = levenshtein(skel, b.skel, limit=limit)
            if d < best:
                best, best_brand = d, b.domain
            if d <= b.budget and raw != b.core and lookalike_brand is None:
                lookalike_brand = b.domain
    brand = other_tld_brand or lookalike_brand or in_host_brand or (best_brand if best == 0 else None)
    return BrandMatch(brand=brand, lookalike=lookalike_brand is not None, other_tld=other_tld_brand is not None,
                      in_host=in_host_brand is not None, edits=best)
