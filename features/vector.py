"""The decision record's `features` map and the numeric vector for a tabular model.

`assemble(post, counts)` = features computed from the post alone (URL, journey, profile, text) merged
with `counts`, the union of the table states' `Update.features` and `ban_features`. The result has
exactly FEATURE_NAMES as keys; a value is None when the input lacks it (no link, no journey, ...).

`to_numeric_vector` covers NUMERIC_FEATURES only, in order: booleans as 0/1, None as NaN. String features
(STRING_FEATURES) are left out: a hash of a domain is not an ordered quantity a tree can split on, and
their signal already reaches the model through the numeric reputation/count features of that domain.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np
from modpipe.features.brands import brand_match
from modpipe.features.events import parse_ts
from modpipe.features.journey import JOURNEY_FEATURES, journey_features
from modpipe.features.url import parse_url

from modpipe import memory

URL_STATIC = (
    "url_present", "url_valid", "url_subdomain_count", "url_age", "url_wot_score", "url_google_score",
    "url_is_ip", "url_ip_obfuscated", "url_punycode", "url_unicode_host", "url_shortener",
    "url_brand_lookalike", "url_brand_other_tld", "url_brand_in_host", "url_brand_distance",
    "url_has_userinfo", "url_nonstandard_port", "url_https", "url_length", "url_host_length",
    "url_host_digits", "url_host_hyphens", "url_path_length", "url_path_depth", "url_query_length",
    "url_query_params", "url_tracking_params",
)
# Filled from the tables (state.*.apply_post) and the bans table (state.ban_features).
COUNT_FEATURES = (
    "url_post_count", "url_distinct_posters", "post_share_count", "post_comment_count", "domain_report_count",
    "domain_post_count",
    "user_posts", "user_spam_posts", "user_spam_report", "user_link_count", "user_post_count",
    "user_posts_1h", "user_posts_24h", "user_report_count",
    "ip_posts", "ip_spam_posts", "ip_distinct_users",
    "post_report_count",
    "domain_banned", "ip_banned",
)
PROFILE = ("user_age", "user_friends", "user_followers", "user_verified", "text_length")
NUMERIC_FEATURES: tuple[str, ...] = URL_STATIC + COUNT_FEATURES + PROFILE + JOURNEY_FEATURES
STRING_FEATURES: tuple[str, ...] = ("url_domain", "url_tld", "url_token", "url_brand", "user_email_domain")
CATEGORICAL = STRING_FEATURES
FEATURE_NAMES: tuple[str, ...] = NUMERIC_FEATURES + STRING_FEATURES
assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES)


def _num(value: Any) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or math.isinf(value):
        return None
    return value


def url_features(url: Any, reputation: Any = None) -> dict[str, Any]:
    rep = reputation if isinstance(reputation, dict) else {}
    out: dict[str, Any] = dict.fromkeys(URL_STATIC + ("url_domain", "url_tld", "url_token", "url_brand"))
    # Reputation comes from the post as given, never invented: None unless present and numeric.
    out["url_age"] = _num(rep.get("age_days"))
    out["url_wot_score"] = _num(rep.get("wot_score"))
    out["url_google_score"] = _num(rep.get("google_risk"))
    if not url or not isinstance(url, str):
        out["url_present"] = False
        return out
    info = parse_url(url)
    out.update(url_present=True, url_valid=info.valid, url_length=info.raw_length,
               url_has_userinfo=info.has_userinfo)
    if not info.valid:
        return out
    brand = brand_match(info)
    host = info.host or ""
    out.update(
        url_domain=info.domain, url_tld=info.tld, url_token=info.token, url_subdomain_count=info.subdomain_count,
        url_is_ip=info.is_ip, url_ip_obfuscated=info.ip_obfuscated, url_punycode=info.punycode,
        url_unicode_host=info.unicode_host, url_shortener=info.shortener,
        url_brand=brand.brand, url_brand_lookalike=brand.lookalike, url_brand_other_tld=brand.other_tld,
        url_brand_in_host=brand.in_host, url_brand_distance=brand.edits,
        url_nonstandard_port=info.port is not None, url_https=info.scheme == "https",
        url_host_length=len(host), url_host_digits=sum(c.isdigit() for c in host) if not info.is_ip else 0,
        url_host_hyphens=host.count("-"), url_path_length=0 if info.path == "/" else len(info.path),
        url_path_depth=0 if info.path == "/" else info.path.count("/"), url_query_length=len(info.query),
        url_query_params=info.query_params, url_tracking_params=info.tracking_params,
    )
    return out


def profile_features(post: dict) -> dict[str, Any]:
    user = post.get("user") if isinstance(post.get("user"), dict) else {}
    created, joined = parse_ts(post.get("created_at")), parse_ts(user.get("created_at"))
    email = user.get("email_domain")
    if isinstance(email, str):  # accept a whole address too: keep what follows the last "@"
        email = email.strip().lower().rpartition("@")[2].rstrip(".") or None
    else:
        email = None
    verified = user.get("verified")
    text = post.get("text")
    return {
        "user_age": round((created - joined) / 86_400_000, 4) if created is not None and joined is not None
        else None,
        "user_email_domain": email,
        "user_friends": _num(user.get("friends")),
        "user_followers": _num(user.get("followers")),
        "user_verified": verified if isinstance(verified, bool) else None,
        "text_length": len(text) if isinstance(text, str) else None,
    }


def static_features(post: dict) -> dict[str, Any]:
    """Everything computable from the post alone (no tables)."""
    out = url_features(post.get("url"), post.get("url_reputation"))
    out.update(profile_features(post))
    out.update(journey_features(post.get("journey"), out["text_length"]))
    return out


_COUNT_SET = frozenset(COUNT_FEATURES)


def assemble(post: dict, counts: dict[str, Any]) -> dict[str, Any]:
    """The decision record's features map: FEATURE_NAMES in order, missing counts as None.

    Unknown keys in `counts` raise ValueError: they mean the wiring and this module disagree."""
    if not _COUNT_SET.issuperset(counts):
        raise ValueError(f"unknown count features: {sorted(set(counts) - _COUNT_SET)}")
    merged = static_features(post)
    merged.update(counts)
    return {name: merged.get(name) for name in FEATURE_NAMES}


_KEYS_BYTES = sum(map(memory.str_size, FEATURE_NAMES))
_NUMERIC_BYTES = len(NUMERIC_FEATURES) * memory.SCALAR_BOUND


def features_size(features: dict[str, Any]) -> int:
    """At least `memory.approx_size(features)` of a map `assemble` made (the decision queue sizes one per
    post): FEATURE_NAMES as keys, each numeric value a scalar within `memory.SCALAR_BOUND`, so only the string
    features are measured. A map of another length is walked."""
    if len(features) != len(FEATURE_NAMES):
        return memory.approx_size(features)
    size = sys.getsizeof(features) + _KEYS_BYTES + _NUMERIC_BYTES
    for name in STRING_FEATURES:
        value = features.get(name)
        size += memory.SCALAR_BOUND if value is None else memory.approx_size(value)
    return size


def to_vector(features: dict[str, Any], names: tuple[str, ...]) -> list[float]:
    """`names` as floats: True/False -> 1.0/0.0, None (or non-numeric, or infinite) -> NaN (missing)."""
    out = []
    nan = math.nan
    for name in names:
        v = features.get(name)
        kind = type(v)  # exact types first: this runs for every feature of every decision
        if kind is float:
            out.append(v if v - v == 0.0 else nan)  # inf - inf and nan - nan are nan
        elif kind is int:
            out.append(float(v))
        elif kind is bool:
            out.append(1.0 if v else 0.0)
        elif v is None or kind is str:
            out.append(nan)
        elif isinstance(v, bool):
            out.append(1.0 if v else 0.0)
        elif isinstance(v, int | float) and v == v and not math.isinf(v):
            out.append(float(v))
        else:
            out.append(nan)
    return out


_PLAIN = frozenset((float, int, bool, type(None)))  # what numpy converts to float64 as `to_vector` does (but inf)


def to_matrix(features_list: list[dict[str, Any]], names: tuple[str, ...]) -> np.ndarray:
    """`to_vector` of each map as the rows of one float64 array, equal to it value for value. Rows of plain
    values (float, int, bool, None) are converted by numpy in one call (None -> NaN, then inf -> NaN); a row
    holding anything else (a string, which numpy would parse, a numpy scalar) goes through `to_vector`."""
    rows = [list(map(f.get, names)) for f in features_list]
    plain = [_PLAIN.issuperset(map(type, row)) for row in rows]
    if not all(plain):
        rows = [row if ok else to_vector(f, names) for row, ok, f in zip(rows, plain, features_list, strict=True)]
    x = np.array(rows, dtype=np.float64).reshape(len(rows), len(names))
    x[np.isinf(x)] = math.nan
    return x


def to_numeric_vector(features: dict[str, Any]) -> list[float]:
    """NUMERIC_FEATURES as floats (see `to_vector`)."""
    return to_vector(features, NUMERIC_FEATURES)


__all__ = ["FEATURE_NAMES", "NUMERIC_FEATURES", "STRING_FEATURES", "CATEGORICAL", "COUNT_FEATURES",
           "assemble", "features_size", "static_features", "url_features", "profile_features", "to_numeric_vector", "to_vector",
           "to_matrix"]
