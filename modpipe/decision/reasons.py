"""Reason codes in words a moderator understands: a feature and its value -> one short sentence."""

from __future__ import annotations

from typing import Any

_YES_NO = {
    "url_present": ("the post has a link", "the post has no link"),
    "url_valid": ("the link is well-formed", "the link is malformed"),
    "url_is_ip": ("the link points at a bare IP address", "the link uses a host name"),
    "url_ip_obfuscated": ("the link hides an IP address in an odd notation", "the link's IP notation is plain"),
    "url_punycode": ("the link's host is punycode (possible homograph)", "the link's host is not punycode"),
    "url_unicode_host": ("the link's host has non-ASCII letters", "the link's host is ASCII"),
    "url_shortener": ("the link goes through a URL shortener", "the link is not shortened"),
    "url_brand_lookalike": ("the link's domain imitates a known brand", "the link's domain imitates no brand"),
    "url_brand_other_tld": ("the link uses a brand name under a foreign TLD", "no brand under a foreign TLD"),
    "url_brand_in_host": ("a brand name appears inside the link's host", "no brand name inside the link's host"),
    "url_has_userinfo": ("the link carries a user@ part (a phishing trick)", "the link has no user@ part"),
    "url_nonstandard_port": ("the link uses a non-standard port", "the link uses a standard port"),
    "url_https": ("the link uses HTTPS", "the link does not use HTTPS"),
    "user_spam_report": ("the author has been reported before", "the author was never reported"),
    "domain_banned": ("the link's domain is banned", "the link's domain is not banned"),
    "ip_banned": ("the poster's IP address is banned", "the poster's IP address is not banned"),
    "user_verified": ("the account is verified", "the account is not verified"),
    "journey_paste": ("the text was pasted", "the text was not pasted"),
    "journey_has_submit": ("the UI journey ends in a submit", "the UI journey has no submit step"),
    "journey_submit_without_typing": ("the post was submitted without any typing", "the author typed the post"),
}

# feature -> sentence with {v}; numbers are formatted before substitution
_TEMPLATES = {
    "text_probability": "the text classifier rates the text {p} likely spam",
    "url_subdomain_count": "the link's host has {v} subdomain level(s)",
    "url_age": "the link's domain is {v} days old",
    "url_wot_score": "the link's web-of-trust score is {v}/100",
    "url_google_score": "the link's safe-browsing risk score is {v}",
    "url_brand_distance": "the link's domain is {v} edit(s) away from a brand",
    "url_length": "the link is {v} characters long",
    "url_host_length": "the link's host is {v} characters long",
    "url_host_digits": "the link's host has {v} digit(s)",
    "url_host_hyphens": "the link's host has {v} hyphen(s)",
    "url_path_length": "the link's path is {v} characters long",
    "url_path_depth": "the link's path is {v} level(s) deep",
    "url_query_length": "the link's query string is {v} characters long",
    "url_query_params": "the link has {v} query parameter(s)",
    "url_tracking_params": "the link has {v} tracking parameter(s)",
    "url_post_count": "this link has been posted {v} time(s)",
    "url_distinct_posters": "{v} different account(s) posted this link",
    "post_share_count": "the link has been shared {v} time(s)",
    "post_comment_count": "the link has been commented on {v} time(s)",
    "domain_report_count": "the link's domain has been reported {v} time(s)",
    "domain_post_count": "the link's domain has been posted {v} time(s)",
    "user_posts": "the author has posted {v} time(s)",
    "user_spam_posts": "{v} of the author's posts were judged spam",
    "user_link_count": "the author posted this link {v} time(s)",
    "user_post_count": "the author posted this same text {v} time(s)",
    "user_posts_1h": "the author posted {v} time(s) in the last hour",
    "user_posts_24h": "the author posted {v} time(s) in the last 24 hours",
    "user_report_count": "the author has been reported {v} time(s)",
    "ip_posts": "{v} post(s) came from this IP address",
    "ip_spam_posts": "{v} post(s) from this IP address were judged spam",
    "ip_distinct_users": "{v} different account(s) posted from this IP address",
    "post_report_count": "this post has been reported {v} time(s)",
    "user_age": "the account is {v} days old",
    "user_friends": "the account has {v} friend(s)",
    "user_followers": "the account has {v} follower(s)",
    "text_length": "the text is {v} characters long",
    "journey_steps": "the UI journey had {v} step(s)",
    "journey_total_ms": "the UI journey took {v} ms",
    "journey_min_step_ms": "the fastest UI step took {v} ms",
    "journey_max_step_ms": "the slowest UI step took {v} ms",
    "journey_typing_ms": "the author spent {v} ms typing",
    "journey_typing_cps": "the text was typed at {v} characters per second",
    "journey_invalid_steps": "the UI journey had {v} malformed step(s)",
}


def _fmt(v: float) -> str:
    if float(v).is_integer():
        return f"{int(v):,}"
    return f"{v:.2f}" if abs(v) < 100 else f"{v:,.0f}"


def describe(feature: str, value: Any) -> str:
    """One sentence about a feature's value; None means the post did not carry it."""
    if value is None or (isinstance(value, float) and value != value):
        return f"{feature.replace('_', ' ')}: unknown"
    if feature in _YES_NO:
        yes, no = _YES_NO[feature]
        return yes if value else no
    if feature == "text_probability":
        return _TEMPLATES[feature].format(p=f"{float(value):.0%}")
    if feature in _TEMPLATES and isinstance(value, int | float):
        return _TEMPLATES[feature].format(v=_fmt(float(value)))
    return f"{feature.replace('_', ' ')} = {value}"


def has_description(feature: str) -> bool:
    return feature in _YES_NO or feature in _TEMPLATES
