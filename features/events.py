"""Raw events -> small normalised *context* dicts, and which table keys each event updates.

A context is computed once (URL parsing, fingerprint, timestamps) where the event enters the pipeline
and travels as a plain JSON-able dict through repartitions, so every table agent works from the same
derived keys. Table names and keys:

  user    user_id         posts, reports (by reported_user_id), labels, decisions
  url     url key         posts, engagements (by the engagement's url)
  domain  registrable dom posts, reports (by the report's url, or routed from the post table)
  ip      ip              posts, decisions, labels (routed from the post table: labels carry no ip)
  post    post_id         posts, reports, engagements, labels, decisions, bans (routed from the domain table)
  bans    ban key         bans (a small GlobalTable: a post needs several domain keys at once)
  domain                  also domain bans, to find the recent posts a ban covers
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import json
from typing import Any

from modpipe.features.text import text_fingerprint
from modpipe.features.url import parse_url, url_key

from modpipe import memory

USER, URL, DOMAIN, IP, POST, BANS = "user", "url", "domain", "ip", "post", "bans"
TABLES = (USER, URL, DOMAIN, IP, POST)

# Stages: tables that share one partitioning (and one stage topic in the streaming path), in the order a
# post visits them. A URL belongs to one registrable domain, so the url table is partitioned by its
# link's domain and shares the link stage with the domain table: one hop instead of two, at the price
# that every URL of a hot domain lands on that domain's partition.
STAGES: dict[str, tuple[str, ...]] = {"user": (USER,), "link": (URL, DOMAIN), "ip": (IP,), "post": (POST,)}
STAGE_OF = {table: stage for stage, tables in STAGES.items() for table in tables}
EVENT_KINDS = ("post", "report", "engagement", "label", "decision", "ban")


def parse_ts(value: Any) -> int | None:
    """RFC 3339 (or ISO 8601) string -> epoch milliseconds; naive times are UTC; numbers are epoch seconds.

    Returns None for anything unparseable rather than raising: one bad timestamp must not stop a stream."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return int(value * 1000) if value == value and abs(value) < 1e11 else None
    if not isinstance(value, str):
        return None
    s = value.strip()
    if s[-1:] in ("z", "Z"):
        s = s[:-1] + "+00:00"
    try:
        t = dt.datetime.fromisoformat(s)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return int(t.timestamp() * 1000)


def normalize_ip(value: Any) -> str | None:
    """Canonical text of an IPv4/IPv6 address (IPv4-mapped IPv6 -> IPv4), None when not an address."""
    if not isinstance(value, str) or len(value) > 64:  # the longest address with a zone is ~50 characters
        return None
    return _normalize_ip(value)


@memory.cached("ip_normalize")  # a platform's IPs repeat (homes, carriers, a campaign's /24)
def _normalize_ip(value: str) -> str | None:
    try:
        addr = ipaddress.ip_address(value.strip().strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.compressed


def _id(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)


def event_id(event: dict, field: str, prefix: str) -> str:
    """The event's id, or a content hash when it has none: still stable across re-deliveries."""
    value = _id(event.get(field))
    if value is not None:
        return value
    blob = json.dumps(event, sort_keys=True, default=str, ensure_ascii=False)
    return f"{prefix}:" + hashlib.blake2b(blob.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()


def prepare_post(post: dict) -> dict:
    """Keys and derived values of a post that the tables need (JSON-able)."""
    url = post.get("url") or None
    info = parse_url(url) if url else None
    valid = info is not None and info.valid
    return {
        "post_id": event_id(post, "post_id", "post"),
        "user_id": _id(post.get("user_id")),
        "ts": parse_ts(post.get("created_at")) or 0,
        "ip": normalize_ip(post.get("ip")),
        "url_key": info.key if valid else None,
        "domain": info.domain if valid else None,
        "host": info.host if valid else None,
        "text_fp": text_fingerprint(post.get("text")),
    }


def prepare_report(report: dict) -> dict:
    return {
        "report_id": event_id(report, "report_id", "report"),
        "post_id": _id(report.get("post_id")),
        "reported_user_id": _id(report.get("reported_user_id")),
        "domain": _domain(report.get("url")),
        "reason": report.get("reason"),
        "ts": parse_ts(report.get("created_at")) or 0,
    }


def prepare_engagement(engagement: dict) -> dict:
    kind = str(engagement.get("kind") or "").lower()
    return {
        "engagement_id": event_id(engagement, "engagement_id", "engagement"),
        "post_id": _id(engagement.get("post_id")),
        "url_key": url_key(engagement.get("url")),
        "domain": _domain(engagement.get("url")),  # places the url key on its link-stage partition
        "kind": kind if kind in ("share", "comment") else None,
        "user_id": _id(engagement.get("user_id")),
        "ts": parse_ts(engagement.get("created_at")) or 0,
    }


def prepare_label(label: dict) -> dict:
    value = str(label.get("label") or "").lower()
    return {
        "post_id": _id(label.get("post_id")),
        "user_id": _id(label.get("user_id")),
        "spam": True if value == "spam" else False if value == "ham" else None,
        "moderator_id": _id(label.get("moderator_id")),
        "ts": parse_ts(label.get("created_at")) or 0,
    }


def prepare_decision(post_ctx: dict, spam: bool, decided_at: Any = None, revision: int | None = None) -> dict:
    """The pipeline's own verdict on a post, fed back so `user_spam_posts`/`ip_spam_posts` include it.

    `decided_at` defaults to the post's created_at: event time keeps replays deterministic. `revision` is the
    decision's (None: unknown, e.g. a scripted decision event); see `routes` for what a first one skips."""
    ts = parse_ts(decided_at) if decided_at is not None else None
    return {"post_id": post_ctx["post_id"], "user_id": post_ctx["user_id"], "ip": post_ctx["ip"],
            "spam": bool(spam), "ts": ts if ts is not None else post_ctx["ts"], "revision": revision}


def ban_key(kind: Any, value: Any) -> str | None:
    """`domain:<host>` or `ip:<address>`. Domain values may be hosts, URLs or `*.host`."""
    kind = str(kind or "").lower()
    if kind == "ip":
        ip = normalize_ip(value)
        return f"ip:{ip}" if ip else None
    if kind == "domain" and isinstance(value, str):
        v = value.strip()
        v = v[2:] if v.startswith("*.") else v
        info = parse_url(v)
        return f"domain:{info.host}" if info.valid else None
    return None


def prepare_ban(ban: dict) -> dict:
    action = str(ban.get("action") or "").lower()
    key = ban_key(ban.get("kind"), ban.get("value"))
    host = key.partition(":")[2] if key and key.startswith("domain:") else None
    return {
        "ban_id": _id(ban.get("ban_id")) or "",
        "key": key,
        "host": host,  # a domain ban's host, and its registrable domain (the domain table's key)
        "domain": _domain(host) if host else None,
        "banned": True if action == "ban" else False if action == "unban" else None,
        "ts": parse_ts(ban.get("created_at")) or 0,
    }


def post_ban_keys(ctx: dict) -> dict[str, list[str]]:
    """Ban keys to look up for a post: its link host and each parent down to the registrable domain
    (a ban on `evil.com` covers `login.evil.com`; one on `login.evil.com` does not cover `evil.com`)."""
    domain_keys = []
    host, domain = ctx.get("host"), ctx.get("domain")
    if host and domain:
        labels = host.split(".")
        for i in range(len(labels)):
            cand = ".".join(labels[i:])
            domain_keys.append(f"domain:{cand}")
            if cand == domain or len(cand) <= len(domain):
                break
    return {"domain": domain_keys, "ip": [f"ip:{ctx['ip']}"] if ctx.get("ip") else []}


def _domain(url: Any) -> str | None:
    if not url:
        return None
    info = parse_url(url)
    return info.domain if info.valid else None


def routes(kind: str, ctx: dict) -> list[tuple[str, str]]:
    """(table, key) pairs an event updates directly; routed follow-ups come from the post table."""
    out: list[tuple[str, str | None]]
    if kind == "post":
        out = [(USER, ctx["user_id"]), (URL, ctx["url_key"]), (DOMAIN, ctx["domain"]), (IP, ctx["ip"]),
               (POST, ctx["post_id"])]
    elif kind == "report":
        out = [(POST, ctx["post_id"]), (USER, ctx["reported_user_id"]), (DOMAIN, ctx["domain"])]
    elif kind == "engagement":
        out = [(URL, ctx["url_key"]), (POST, ctx["post_id"])]
    elif kind == "label":
        out = [(USER, ctx["user_id"]), (POST, ctx["post_id"])]
    elif kind == "decision":
        # A post's first decision that is not spam changes nothing in the user and ip tables (SpamMarks keep a
        # ham decision only to override an earlier spam one): it goes to the post table alone. Most posts are
        # ham, so this saves two of their three feedback records.
        first_ham = ctx.get("revision") == 1 and not ctx["spam"]
        out = [(USER, None if first_ham else ctx["user_id"]), (IP, None if first_ham else ctx["ip"]),
               (POST, ctx["post_id"])]
    elif kind == "ban":
        # The domain table lists its recent posts: a ban after the fact re-decides those it covers.
        out = [(BANS, ctx["key"]), (DOMAIN, ctx.get("domain") if ctx.get("banned") else None)]
    else:
        raise ValueError(f"unknown event kind {kind!r}")
    return [(t, k) for t, k in out if k]


PREPARE = {"post": prepare_post, "report": prepare_report, "engagement": prepare_engagement,
           "label": prepare_label, "ban": prepare_ban}


def partition_key(table: str, key: str, ctx: dict) -> str:
    """What places a table key on its stage's partition: the key itself, except that a url key is placed
    by its registrable domain (the events that update the url table carry it in `domain`)."""
    if table == URL:
        return ctx.get("domain") or key
    return key


def hops(targets: list[tuple[str, str]], ctx: dict) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """Group (table, key) targets into stage hops, in order: [(stage, partition key, [(table, key), ...])].
    Consecutive targets on the same stage and partition share a hop (a post's url and domain counts)."""
    out: list[tuple[str, str, list[tuple[str, str]]]] = []
    for table, key in targets:
        stage, pkey = STAGE_OF[table], partition_key(table, key, ctx)
        if out and out[-1][0] == stage and out[-1][1] == pkey:
            out[-1][2].append((table, key))
        else:
            out.append((stage, pkey, [(table, key)]))
    return out
