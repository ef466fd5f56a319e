"""Per-key table states: exact counts, idempotent under re-delivery, bounded memory, JSON round-trip.

The stream runtime processes each input record once: a worker that crashes restores its tables from
changelogs that hold only states committed together with the input offsets that produced them, and
processes again only the input after those offsets (streams/checkpointing/checkpoint.py). Events still come twice from
upstream: a platform that sends a post, report, engagement or label again (a retry of a producer without
idempotence, a replayed export) writes a second record with the same id. So every count here is keyed by
the *event id* and applying an event twice equals applying it once.

Exactness vs memory (documented per structure; defaults in `Limits`):

* `DedupCounter` keeps the ids of the `dedup_ids` most recent events (ordered by (event time, id)) and a
  high-water mark = the largest evicted (time, id). An id among them was counted; an event above the mark
  and not among them is new; an event at or below the mark and not among them cannot be told apart: a
  re-delivery of an evicted event, or a new event dated that far back. Side events (reports, engagements,
  labels) take it as counted: never double counted, a new one missed only if it arrives behind `dedup_ids`
  newer events of its key. A post is never missed: its first table asks the post table, keyed by post_id,
  which knows (`count_post`, `PostState.apply_post_check`). Only the first table on a post's route judges by
  ids, in the order of one input partition; the tables after it count what it (or the post table) decided,
  so a stage hop that holds a key's posts back (a partition that stood still) costs no counts.
* `DistinctSet` stores members exactly up to `distinct` members, then saturates (count stays = cap).
* `SlidingWindow` keeps post times within 24 h + `window_grace_ms` of the newest one and at most
  `window_entries`: windowed counts are exact for posts at most that grace late, and None (not a wrong
  number) when the window reaches below what was evicted.
* `BoundedCounts` (per-user link/text counts) keeps `per_user_keys` entries, least recently used evicted.
* `SpamMarks` keeps the latest label/decision of the `spam_marks` most recently marked posts; older
  posts are folded into a base count, so re-labelling a post after that many newer marks is not seen.

States are mutable objects; tables store `to_dict()` and rebuild with `from_dict()`. Neither shares a
mutable part with its argument: a worker keeps states in memory across batches while the dicts it
wrote are still queued for the changelog.
"""

from __future__ import annotations

import bisect
import dataclasses
from typing import Any

from modpipe.features.events import BANS, DOMAIN, IP, POST, URL, USER, post_ban_keys

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclasses.dataclass(frozen=True)
class Limits:
    dedup_ids: int = 256  # an event sent again upstream comes back soon: far fewer newer events than this per key
    distinct: int = 10_000
    window_entries: int = 5_000
    window_grace_ms: int = HOUR_MS
    per_user_keys: int = 512
    spam_marks: int = 1_024
    pending: int = 32
    recent_posts: int = 256  # per domain: the posts a later ban re-decides


DEFAULT_LIMITS = Limits()


@dataclasses.dataclass
class Update:
    """What applying one event did: `changed` whether the state changed (False for a re-delivery); `features` the
    table's share of a post's features (posts only); `followups` events to apply to other tables: (table, key,
    kind, ctx); `new` for a post, whether this table takes it for new (None: cannot tell, nothing applied)."""
    changed: bool
    features: dict[str, Any] = dataclasses.field(default_factory=dict)
    followups: list[tuple[str, str, str, dict]] = dataclasses.field(default_factory=list)
    new: bool | None = False


# --------------------------------------------------------------------------- primitives


class DedupCounter:
    """Count of distinct event ids; see the module docstring for the exactness argument."""

    def __init__(self, cap: int = DEFAULT_LIMITS.dedup_ids):
        self.cap = cap
        self.count = 0
        # Sorted [ts, id] of counted events above the mark. Lists, not tuples: they are stored and
        # loaded as-is, without a per-element conversion on every table read.
        self.recent: list[list] = []
        self._ids: set[str] = set()
        self.hwm: list | None = None

    def judge(self, event_id: str, ts: int) -> bool | None:
        """True: counted already; False: new; None: cannot tell (at or below the mark, its id not kept)."""
        if event_id in self._ids:
            return True
        return None if self.hwm is not None and [ts, event_id] <= self.hwm else False

    def add(self, event_id: str, ts: int) -> bool:
        """Count the event unless already counted; True when counted."""
        if event_id in self._ids:
            return False
        # At/below the mark: a re-delivery (or later than `cap` newer events). No counter of these is
        # kept, so that applying an event twice leaves the stored state identical.
        if self.hwm is not None and [ts, event_id] <= self.hwm:
            return False
        self.count += 1
        bisect.insort(self.recent, [ts, event_id])
        self._ids.add(event_id)
        while len(self.recent) > self.cap:
            # Only the minimum is ever evicted: every counted event above the mark stays in `recent`.
            victim = self.recent.pop(0)
            self._ids.discard(victim[1])
            self.hwm = victim if self.hwm is None else max(self.hwm, victim)
        return True

    def to_dict(self) -> dict:
        return {"n": self.count, "recent": list(self.recent), "hwm": self.hwm}

    @classmethod
    def from_dict(cls, d: dict | None, cap: int = DEFAULT_LIMITS.dedup_ids) -> DedupCounter:
        c = cls(cap)
        if d:
            c.count = d["n"]
            c.recent = list(d["recent"])  # written sorted by to_dict
            c._ids = {e[1] for e in c.recent}
            c.hwm = d.get("hwm")
        return c


# A post's item carries whether it is a re-send, decided by the first table on its route (events.routes), or by
# the post table when that one cannot tell: set by `mark_post`, read by `count_post` in the tables after it.
RESENT = "resent"
# Set when the post table judged the post (`PostState.apply_post_check`): at the end of the route it finds
# the post it claimed, not an earlier copy.
CHECKED = "checked"
# The kind of a post's visit to the post table that asks whether its id is new.
POST_CHECK = "post_check"


def mark_post(ctx: dict, new: bool, checked: bool = False) -> None:
    """After a post was judged by a table on its route: the first table that could tell decides, for the rest."""
    ctx.setdefault(RESENT, not new)
    if checked:
        ctx[CHECKED] = True


def count_post(counter: DedupCounter, ctx: dict) -> bool | None:
    """Count a post in `counter`; True when counted, None when this table cannot tell (nothing counted).

    The first table on the post's route (no RESENT mark yet: the user table, for a post with a user) tells
    a re-send by its ids; it reads the posts of a key in the order of one input partition, so a re-send
    shows up there soon after the original. A post dated at or below its mark whose id it no longer keeps (a
    backfill, a backdated post, a re-send of a post long evicted) it cannot tell: the post table is asked
    (it keeps every post by id) and the post comes back marked. The tables after the first count what was
    decided, without ids: the stage hops on the way can hold a key's posts back for longer than any id window
    (a partition whose worker stood still for a minute) but never deliver an item twice (each hop is one
    transaction). A post counted by mark is not added to the ids: one at or below the mark would be the
    oldest of a full window, evicted at once."""
    resent = ctx.get(RESENT)
    if resent is None:
        seen = counter.judge(ctx["post_id"], ctx["ts"])
        if seen is None:
            return None
        return not seen and counter.add(ctx["post_id"], ctx["ts"])
    if not resent:
        counter.count += 1
    return not resent


def post_is_new(ctx: dict, post_update: Update) -> bool:
    """At the post table, the last on a post's route: whether the post is new and gets its decision. The post
    table has the last word: a first table that took a post for new by its ids (a re-send whose created_at
    differs from its original's, the original evicted from the ids) is overruled, so no post is decided twice."""
    if ctx[RESENT]:
        return False
    return bool(ctx.get(CHECKED) or post_update.new)


class DistinctSet:
    """Exact distinct members up to `cap`; then saturated (new members are not stored or counted)."""

    def __init__(self, cap: int = DEFAULT_LIMITS.distinct):
        self.cap = cap
        self.members: set[str] = set()
        self.saturated = False

    @property
    def count(self) -> int:
        return len(self.members)

    def add(self, member: str) -> bool:
        if member in self.members:
            return False
        if len(self.members) >= self.cap:
            self.saturated = True
            return False
        self.members.add(member)
        return True

    def to_dict(self) -> dict:
        return {"m": sorted(self.members), "sat": self.saturated}

    @classmethod
    def from_dict(cls, d: dict | None, cap: int = DEFAULT_LIMITS.distinct) -> DistinctSet:
        s = cls(cap)
        if d:
            s.members = set(d["m"])
            s.saturated = d.get("sat", False)
        return s


class SlidingWindow:
    """Event times of one key's posts, for counts over windows ending at a post's created_at.

    `floor` is the newest evicted time: a window reaching below it may have lost entries, and its count
    is None (unknown) rather than a silently low number - e.g. a post arriving more than a day late."""

    def __init__(self, horizon_ms: int = DAY_MS, grace_ms: int = DEFAULT_LIMITS.window_grace_ms,
                 cap: int = DEFAULT_LIMITS.window_entries):
        self.horizon_ms, self.grace_ms, self.cap = horizon_ms, grace_ms, cap
        self.entries: list[int] = []  # sorted event times; callers add each event once (dedup gate)
        self.max_ts: int | None = None
        self.floor: int | None = None

    def add(self, ts: int) -> None:
        bisect.insort(self.entries, ts)
        self.max_ts = ts if self.max_ts is None else max(self.max_ts, ts)
        cutoff = self.max_ts - self.horizon_ms - self.grace_ms
        drop = bisect.bisect_right(self.entries, cutoff)
        drop = max(drop, len(self.entries) - self.cap)
        if drop > 0:
            newest_dropped = self.entries[drop - 1]
            self.floor = newest_dropped if self.floor is None else max(self.floor, newest_dropped)
            del self.entries[:drop]

    def count(self, t: int, width_ms: int) -> int | None:
        """Events with t - width < ts <= t (the post at t itself included once added); None if unknown."""
        if self.floor is not None and self.floor > t - width_ms:
            return None
        hi = bisect.bisect_right(self.entries, t)
        lo = bisect.bisect_right(self.entries, t - width_ms)
        return hi - lo

    def to_dict(self) -> dict:
        return {"e": list(self.entries), "max": self.max_ts, "floor": self.floor}

    @classmethod
    def from_dict(cls, d: dict | None, limits: Limits = DEFAULT_LIMITS) -> SlidingWindow:
        w = cls(grace_ms=limits.window_grace_ms, cap=limits.window_entries)
        if d:
            w.entries = list(d["e"])
            w.max_ts, w.floor = d.get("max"), d.get("floor")
        return w


class BoundedCounts:
    """key -> count, at most `cap` keys, the least recently incremented evicted (ties: smallest key)."""

    def __init__(self, cap: int = DEFAULT_LIMITS.per_user_keys):
        self.cap = cap
        self.items: dict[str, list[int]] = {}  # key -> [count, last ts]

    def incr(self, key: str, ts: int) -> int:
        item = self.items.setdefault(key, [0, ts])
        item[0] += 1
        item[1] = max(item[1], ts)
        if len(self.items) > self.cap:
            victim = min(self.items, key=lambda k: (self.items[k][1], k))
            del self.items[victim]
        return self.items.get(key, [0])[0]

    def get(self, key: str) -> int:
        return self.items.get(key, [0])[0]

    def to_dict(self) -> dict:
        return {k: list(v) for k, v in sorted(self.items.items())}

    @classmethod
    def from_dict(cls, d: dict | None, cap: int = DEFAULT_LIMITS.per_user_keys) -> BoundedCounts:
        b = cls(cap)
        b.items = {k: [int(v[0]), int(v[1])] for k, v in (d or {}).items()}
        return b


class SpamMarks:
    """Which posts of a key are spam. A moderator label beats the pipeline's decision; within a source
    the newest (ts) wins, ties to spam. Order-independent and idempotent (a max per post and source),
    with one caveat: a ham decision is only kept to override a spam decision already present, so two
    decisions on one post arriving newest-first resolve to the older one (the pipeline decides once)."""

    def __init__(self, cap: int = DEFAULT_LIMITS.spam_marks):
        self.cap = cap
        self.marks: dict[str, dict[str, list | None]] = {}  # post_id -> {"l": [ts, spam], "d": [ts, spam]}
        self.base = 0  # spam posts among the evicted
        self.count = 0  # base + spam posts among marks
        self.hwm: tuple[int, str] | None = None

    @staticmethod
    def _is_spam(mark: dict) -> bool:
        slot = mark.get("l") or mark.get("d")
        return bool(slot and slot[1])

    @staticmethod
    def _ts(mark: dict) -> int:
        return max(s[0] for s in mark.values() if s)

    def is_spam(self, post_id: str) -> bool | None:
        mark = self.marks.get(post_id)
        return None if mark is None else self._is_spam(mark)

    def apply(self, post_id: str, source: str, ts: int, spam: bool) -> bool:
        mark = self.marks.get(post_id)
        if mark is None and self.hwm is not None and (ts, post_id) <= self.hwm:
            return False  # this post was evicted with a newer mark: a replay, or too late to matter
        if source == "d" and not spam and (mark is None or mark["d"] is None):
            # A ham decision overrides nothing but an earlier spam decision: storing it would only cost
            # memory (most posts are ham) and make the stored state depend on arrival order.
            return False
        if mark is None:
            mark = {"l": None, "d": None}
        new = [ts, bool(spam)]
        old = mark[source]
        if old is not None and tuple(new) <= tuple(old):
            return False
        before = post_id in self.marks and self._is_spam(mark)
        mark[source] = new
        self.marks[post_id] = mark
        self.count += int(self._is_spam(mark)) - int(before)
        while len(self.marks) > self.cap:
            victim = min(self.marks, key=lambda p: (self._ts(self.marks[p]), p))
            vmark = self.marks.pop(victim)
            self.base += int(self._is_spam(vmark))
            key = (self._ts(vmark), victim)
            self.hwm = key if self.hwm is None else max(self.hwm, key)
        return True

    def to_dict(self) -> dict:
        return {"marks": {p: dict(m) for p, m in sorted(self.marks.items())}, "base": self.base, "n": self.count,
                "hwm": list(self.hwm) if self.hwm else None}

    @classmethod
    def from_dict(cls, d: dict | None, cap: int = DEFAULT_LIMITS.spam_marks) -> SpamMarks:
        s = cls(cap)
        if d:
            s.marks = {p: {k: (list(v) if v else None) for k, v in m.items()} for p, m in d["marks"].items()}
            s.base, s.count = d["base"], d["n"]
            s.hwm = (int(d["hwm"][0]), str(d["hwm"][1])) if d.get("hwm") else None
        return s


# --------------------------------------------------------------------------- table states


class _State:
    table: str = ""

    def __init__(self, limits: Limits = DEFAULT_LIMITS):
        self.limits = limits

    def apply(self, kind: str, ctx: dict) -> Update:
        """Apply one prepared event (see modpipe.features.events); kinds a table does not track are no-ops."""
        method = getattr(self, f"apply_{kind}", None)
        return method(ctx) if method else Update(False)


class UserState(_State):
    """Keyed by user_id: the poster's history."""
    table = USER

    def __init__(self, limits: Limits = DEFAULT_LIMITS):
        super().__init__(limits)
        self.posts = DedupCounter(limits.dedup_ids)
        self.window = SlidingWindow(grace_ms=limits.window_grace_ms, cap=limits.window_entries)
        self.links = BoundedCounts(limits.per_user_keys)
        self.texts = BoundedCounts(limits.per_user_keys)
        self.spam = SpamMarks(limits.spam_marks)
        self.reports = DedupCounter(limits.dedup_ids)

    def apply_post(self, ctx: dict) -> Update:
        ts = ctx["ts"]
        counted = count_post(self.posts, ctx)
        if counted is None:
            return Update(False, new=None)  # the post table is asked first; the post comes back marked
        if counted:  # one gate for every per-user post count: they are exactly-once together
            self.window.add(ts)
            if ctx["url_key"]:
                self.links.incr(ctx["url_key"], ts)
            self.texts.incr(ctx["text_fp"], ts)
        return Update(counted, {
            "user_posts": self.posts.count,
            "user_posts_1h": self.window.count(ts, HOUR_MS),
            "user_posts_24h": self.window.count(ts, DAY_MS),
            "user_link_count": self.links.get(ctx["url_key"]) if ctx["url_key"] else None,
            "user_post_count": self.texts.get(ctx["text_fp"]),
            "user_spam_posts": self.spam.count,
            "user_report_count": self.reports.count,
            "user_spam_report": self.reports.count > 0,
        }, new=counted)

    def apply_report(self, ctx: dict) -> Update:
        return Update(self.reports.add(ctx["report_id"], ctx["ts"]))

    def apply_label(self, ctx: dict) -> Update:
        if ctx["spam"] is None:
            return Update(False)
        return Update(self.spam.apply(ctx["post_id"], "l", ctx["ts"], ctx["spam"]))

    def apply_decision(self, ctx: dict) -> Update:
        return Update(self.spam.apply(ctx["post_id"], "d", ctx["ts"], ctx["spam"]))

    def to_dict(self) -> dict:
        return {"posts": self.posts.to_dict(), "window": self.window.to_dict(), "links": self.links.to_dict(),
                "texts": self.texts.to_dict(), "spam": self.spam.to_dict(), "reports": self.reports.to_dict()}

    @classmethod
    def from_dict(cls, d: dict | None, limits: Limits = DEFAULT_LIMITS) -> UserState:
        s = cls(limits)
        if d:
            s.posts = DedupCounter.from_dict(d["posts"], limits.dedup_ids)
            s.window = SlidingWindow.from_dict(d["window"], limits)
            s.links = BoundedCounts.from_dict(d["links"], limits.per_user_keys)
            s.texts = BoundedCounts.from_dict(d["texts"], limits.per_user_keys)
            s.spam = SpamMarks.from_dict(d["spam"], limits.spam_marks)
            s.reports = DedupCounter.from_dict(d["reports"], limits.dedup_ids)
        return s


class UrlState(_State):
    """Keyed by the URL count key (modpipe.features.url.UrlInfo.key)."""
    table = URL

    def __init__(self, limits: Limits = DEFAULT_LIMITS):
        super().__init__(limits)
        self.posts = DedupCounter(limits.dedup_ids)
        self.posters = DistinctSet(limits.distinct)
        self.shares = DedupCounter(limits.dedup_ids)
        self.comments = DedupCounter(limits.dedup_ids)

    def apply_post(self, ctx: dict) -> Update:
        counted = count_post(self.posts, ctx)
        if counted is None:
            return Update(False, new=None)
        if counted and ctx["user_id"]:
            self.posters.add(ctx["user_id"])
        return Update(counted, {
            "url_post_count": self.posts.count,
            "url_distinct_posters": self.posters.count,
            "post_share_count": self.shares.count,
            "post_comment_count": self.comments.count,
        }, new=counted)

    def apply_engagement(self, ctx: dict) -> Update:
        counter = {"share": self.shares, "comment": self.comments}.get(ctx["kind"])
        return Update(counter.add(ctx["engagement_id"], ctx["ts"]) if counter else False)

    def to_dict(self) -> dict:
        return {"posts": self.posts.to_dict(), "posters": self.posters.to_dict(),
                "shares": self.shares.to_dict(), "comments": self.comments.to_dict()}

    @classmethod
    def from_dict(cls, d: dict | None, limits: Limits = DEFAULT_LIMITS) -> UrlState:
        s = cls(limits)
        if d:
            s.posts = DedupCounter.from_dict(d["posts"], limits.dedup_ids)
            s.posters = DistinctSet.from_dict(d["posters"], limits.distinct)
            s.shares = DedupCounter.from_dict(d["shares"], limits.dedup_ids)
            s.comments = DedupCounter.from_dict(d["comments"], limits.dedup_ids)
        return s


def _recent_order(entry: list) -> tuple:
    return entry[2], entry[0]


class DomainState(_State):
    """Keyed by registrable domain."""
    table = DOMAIN

    def __init__(self, limits: Limits = DEFAULT_LIMITS):
        super().__init__(limits)
        self.posts = DedupCounter(limits.dedup_ids)
        self.reports = DedupCounter(limits.dedup_ids)
        # [post_id, host, ts] of the `recent_posts` newest posts by (created_at, post_id): which posts stay does not
        # depend on the order they arrived in (a restore, a replay and features.offline keep the same ones)
        self.recent: list[list] = []
        self.bans: list[list] = []  # [ts, key] of bans already applied: a redelivered ban is a no-op

    def apply_post(self, ctx: dict) -> Update:
        counted = count_post(self.posts, ctx)
        if counted is None:
            return Update(False, new=None)
        if counted and ctx.get("host"):
            bisect.insort(self.recent, [ctx["post_id"], ctx["host"], int(ctx.get("ts") or 0)], key=_recent_order)
            del self.recent[:-self.limits.recent_posts]
        return Update(counted, {"domain_post_count": self.posts.count, "domain_report_count": self.reports.count},
                      new=counted)

    def apply_report(self, ctx: dict) -> Update:
        return Update(self.reports.add(ctx["report_id"], ctx["ts"]))

    def apply_ban(self, ctx: dict) -> Update:
        """A domain ban: tell each recent post it covers (the post table re-decides a decided post)."""
        host, mark = ctx.get("host"), [ctx["ts"], ctx["key"]]
        if not ctx.get("banned") or not host or mark in self.bans:
            return Update(False)
        self.bans.append(mark)
        del self.bans[:-self.limits.pending]
        covered = [pid for pid, h, *_ in self.recent if h == host or h.endswith("." + host)]
        return Update(True, followups=[(POST, pid, "ban", {"key": ctx["key"], "ts": ctx["ts"]}) for pid in covered])

    def to_dict(self) -> dict:
        return {"posts": self.posts.to_dict(), "reports": self.reports.to_dict(), "recent": list(self.recent),
                "bans": list(self.bans)}

    @classmethod
    def from_dict(cls, d: dict | None, limits: Limits = DEFAULT_LIMITS) -> DomainState:
        s = cls(limits)
        if d:
            s.posts = DedupCounter.from_dict(d["posts"], limits.dedup_ids)
            s.reports = DedupCounter.from_dict(d["reports"], limits.dedup_ids)
            # entries written without a ts ([post_id, host]) count as the oldest
            s.recent = sorted(([*e, 0] if len(e) == 2 else list(e) for e in d.get("recent", [])), key=_recent_order)
            s.bans = list(d.get("bans", []))
        return s


class IpState(_State):
    """Keyed by poster IP (modpipe.features.events.normalize_ip)."""
    table = IP

    def __init__(self, limits: Limits = DEFAULT_LIMITS):
        super().__init__(limits)
        self.posts = DedupCounter(limits.dedup_ids)
        self.users = DistinctSet(limits.distinct)
        self.spam = SpamMarks(limits.spam_marks)

    def apply_post(self, ctx: dict) -> Update:
        counted = count_post(self.posts, ctx)
        if counted is None:
            return Update(False, new=None)
        if counted and ctx["user_id"]:
            self.users.add(ctx["user_id"])
        return Update(counted, {"ip_posts": self.posts.count, "ip_distinct_users": self.users.count,
                                "ip_spam_posts": self.spam.count}, new=counted)

    def apply_label(self, ctx: dict) -> Update:
        if ctx["spam"] is None:
            return Update(False)
        return Update(self.spam.apply(ctx["post_id"], "l", ctx["ts"], ctx["spam"]))

    def apply_decision(self, ctx: dict) -> Update:
        return Update(self.spam.apply(ctx["post_id"], "d", ctx["ts"], ctx["spam"]))

    def to_dict(self) -> dict:
        return {"posts": self.posts.to_dict(), "users": self.users.to_dict(), "spam": self.spam.to_dict()}

    @classmethod
    def from_dict(cls, d: dict | None, limits: Limits = DEFAULT_LIMITS) -> IpState:
        s = cls(limits)
        if d:
            s.posts = DedupCounter.from_dict(d["posts"], limits.dedup_ids)
            s.users = DistinctSet.from_dict(d["users"], limits.distinct)
            s.spam = SpamMarks.from_dict(d["spam"], limits.spam_marks)
        return s


class PostState(_State):
    """Keyed by post_id: feedback on the post itself, and the routing of events that lack a key.

    Labels carry no IP and reports may carry no URL, so the ip/domain tables learn about them from
    here (`followups`). Such events arriving before their post wait in `pending` (bounded); every
    follow-up is safe to emit again because the receiving tables deduplicate."""
    table = POST

    def __init__(self, limits: Limits = DEFAULT_LIMITS):
        super().__init__(limits)
        self.info: dict | None = None  # {"user_id", "ip", "domain", "ts"} once the post was seen
        self.reports = DedupCounter(limits.dedup_ids)
        self.shares = DedupCounter(limits.dedup_ids)
        self.comments = DedupCounter(limits.dedup_ids)
        self.label: list | None = None  # [ts, spam]
        self.decision: list | None = None
        self.pending: list[list] = []  # [kind, ctx]
        # What the latest decision was made from: {"post", "received_at_ms", "features", "revision",
        # "redecided": [reasons]}; a re-decision starts from it (see `redecision`).
        self.snapshot: dict | None = None
        self.ban: str | None = None  # ban key of a domain ban that covers the post's link
        self.claimed = False  # a post id claimed by `apply_post_check`, its post not here yet (no `info`)

    def _route(self, kind: str, ctx: dict) -> list[tuple[str, str, str, dict]]:
        if self.info is None:
            entry = [kind, ctx]
            if entry not in self.pending and len(self.pending) < self.limits.pending:
                self.pending.append(entry)
            return []
        if kind == "label" and self.info["ip"]:
            return [(IP, self.info["ip"], "label", ctx)]
        if kind == "report" and self.info["domain"]:
            return [(DOMAIN, self.info["domain"], "report", {**ctx, "domain": self.info["domain"]})]
        return []

    def apply_post(self, ctx: dict) -> Update:
        """The post at the end of its route (or its first table, when it has no user, link or ip). `new`: not
        seen before, whatever its created_at (a post that `apply_post_check` claimed counts as seen)."""
        new = self.info is None and not self.claimed
        changed = self.info is None
        if changed:
            self.info = {k: ctx[k] for k in ("user_id", "ip", "domain", "ts")}
            self.claimed = False  # the info says it from now on
        followups = [f for kind, pctx in self.pending for f in self._route(kind, pctx)]
        self.pending = []
        return Update(changed, {"post_report_count": self.reports.count}, followups, new=new)

    def apply_post_check(self, ctx: dict) -> Update:
        """The post's first table could not tell whether it is new (modpipe.features.state.count_post): claim its
        id, so that a copy in flight behind it is a re-send. The post comes back at the end of its route
        (`apply_post`): the events waiting for it are routed then, as for any post."""
        new = self.info is None and not self.claimed
        if new:
            self.claimed = True
        return Update(new, new=new)

    def apply_report(self, ctx: dict) -> Update:
        changed = self.reports.add(ctx["report_id"], ctx["ts"])
        return Update(changed, followups=[] if ctx["domain"] else self._route("report", ctx))

    def apply_engagement(self, ctx: dict) -> Update:
        counter = {"share": self.shares, "comment": self.comments}.get(ctx["kind"])
        return Update(counter.add(ctx["engagement_id"], ctx["ts"]) if counter else False)

    def apply_label(self, ctx: dict) -> Update:
        if ctx["spam"] is None:
            return Update(False)
        new = [ctx["ts"], ctx["spam"]]
        changed = self.label is None or tuple(new) > tuple(self.label)
        if changed:
            self.label = new
        return Update(changed, followups=self._route("label", ctx))

    def apply_decision(self, ctx: dict) -> Update:
        new = [ctx["ts"], ctx["spam"]]
        changed = self.decision is None or tuple(new) > tuple(self.decision)
        if changed:
            self.decision = new
        snap = ctx.get("snapshot")
        if snap and (self.snapshot is None or snap["revision"] > self.snapshot["revision"]):
            self.snapshot = {**snap, "redecided": sorted(set(snap.get("redecided", [])) |
                                                          set((self.snapshot or {}).get("redecided", [])))}
            changed = True
        return Update(changed)

    def apply_ban(self, ctx: dict) -> Update:
        changed = self.ban is None
        if changed:
            self.ban = ctx["key"]
        return Update(changed)

    def redecision(self, report_threshold: int) -> dict | None:
        """A request to decide the post again, at most once per reason, from the stored snapshot:
        `domain_banned` when a ban now covers its link, `reports` when its reports reached the threshold
        (0: never). Marks the reason done and bumps the revision; the caller stores the state."""
        snap = self.snapshot
        if snap is None:
            return None
        features, done = snap["features"], snap.setdefault("redecided", [])
        if self.ban and "domain_banned" not in done and features.get("domain_banned") is not True:
            reason, changes = "domain_banned", {"domain_banned": True}
        elif (report_threshold and "reports" not in done and self.reports.count >= report_threshold
              and self.reports.count > (features.get("post_report_count") or 0)):
            reason, changes = "reports", {"post_report_count": self.reports.count}
        else:
            return None
        done.append(reason)
        # A decision made during a text-model outage is decided again from `posts.awaiting-text` with its revision
        # + 1, a number this state never sees in time: that one is left to it, so no two decisions share one.
        snap["revision"] += 2 if snap.get("degraded") else 1
        snap["features"] = {**features, **changes}
        return {"reason": reason, "revision": snap["revision"], "features": snap["features"], "post": snap["post"],
                "received_at_ms": snap["received_at_ms"]}

    def to_dict(self) -> dict:
        return {"info": self.info, "reports": self.reports.to_dict(), "shares": self.shares.to_dict(),
                "comments": self.comments.to_dict(), "label": self.label, "decision": self.decision,
                "pending": list(self.pending), "snapshot": _copy_snapshot(self.snapshot), "ban": self.ban,
                **({"claimed": True} if self.claimed else {})}  # rare and short-lived: absent otherwise

    @classmethod
    def from_dict(cls, d: dict | None, limits: Limits = DEFAULT_LIMITS) -> PostState:
        s = cls(limits)
        if d:
            s.info = d["info"]
            s.reports = DedupCounter.from_dict(d["reports"], limits.dedup_ids)
            s.shares = DedupCounter.from_dict(d["shares"], limits.dedup_ids)
            s.comments = DedupCounter.from_dict(d["comments"], limits.dedup_ids)
            s.label, s.decision = d["label"], d["decision"]
            s.pending = [list(p) for p in d["pending"]]
            s.snapshot, s.ban = _copy_snapshot(d.get("snapshot")), d.get("ban")
            s.claimed = bool(d.get("claimed"))
        return s


def _copy_snapshot(snapshot: dict | None) -> dict | None:
    """The parts of a snapshot that `redecision` changes in place, copied (its features are replaced, never
    changed): a cached state must not share them with a value already handed to the table."""
    return None if snapshot is None else {**snapshot, "redecided": list(snapshot.get("redecided", []))}


class BanState(_State):
    """Keyed by modpipe.features.events.ban_key. The newest (ts, ban_id) action wins: replays are no-ops."""
    table = BANS

    def __init__(self, limits: Limits = DEFAULT_LIMITS):
        super().__init__(limits)
        self.last: list | None = None  # [ts, ban_id, banned]

    @property
    def banned(self) -> bool:
        return bool(self.last and self.last[2])

    def apply_ban(self, ctx: dict) -> Update:
        if ctx["banned"] is None:
            return Update(False)
        new = [ctx["ts"], ctx["ban_id"], ctx["banned"]]
        changed = self.last is None or tuple(new) > tuple(self.last)
        if changed:
            self.last = new
        return Update(changed)

    def to_dict(self) -> dict:
        return {"last": self.last}

    @classmethod
    def from_dict(cls, d: dict | None, limits: Limits = DEFAULT_LIMITS) -> BanState:
        s = cls(limits)
        if d:
            s.last = d["last"]
        return s


STATE_CLASSES: dict[str, type] = {USER: UserState, URL: UrlState, DOMAIN: DomainState, IP: IpState,
                                  POST: PostState, BANS: BanState}


def new_state(table: str, limits: Limits = DEFAULT_LIMITS):
    return STATE_CLASSES[table](limits)


def load_state(table: str, d: dict | None, limits: Limits = DEFAULT_LIMITS):
    """Rebuild a table value from its stored dict (a changelog record's JSON; None = key not present yet)."""
    return STATE_CLASSES[table].from_dict(d, limits)


def ban_features(ctx: dict, is_banned) -> dict[str, bool | None]:
    """`domain_banned`/`ip_banned` for a prepared post; `is_banned(key) -> bool` reads the bans table.
    None when the post has no link / no IP."""
    keys = post_ban_keys(ctx)
    return {
        "domain_banned": any(is_banned(k) for k in keys["domain"]) if keys["domain"] else None,
        "ip_banned": any(is_banned(k) for k in keys["ip"]) if keys["ip"] else None,
    }
