"""What the review console knows, built from the `posts`, `decisions` and `labels` topics (pure: no Kafka).

Per post: its text and link (from `posts`), every decision revision (from `decisions`, the last record of a
revision standing, so a record read twice changes nothing), and the
moderator's label. The review queue is the posts whose latest decision is `review` and that nobody has
labelled, oldest waiting first; recent blocks likewise. A user's posts are listed newest first.

Bounded: at most `max_posts` posts and `max_bytes` bytes of them (the records' encoded size plus a fixed
overhead per post) are kept, the oldest forgotten first (a post and everything about it), in O(1) per post,
so a console that follows a busy platform for days keeps its memory. Lists are clamped to what the page shows
(MAX_LIST posts, texts cut at LIST_TEXT characters; a post's own page has all of it), and the queue and the
blocks are kept as sets as records arrive, so a read costs the page, not the index.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import heapq
import itertools
import threading
import time
from typing import Any

import orjson

from modpipe import schema

CHART_S = 600  # how far back the charts can look
MAX_LIST = 200  # posts in one list answer: the page shows 100 of the queue and 20 blocks
LIST_TEXT = 1_000  # characters of a post's text in a list (the post's own page has all of it)
POST_OVERHEAD = 1_024  # bytes counted per post beyond its records: the objects that hold them


@dataclasses.dataclass
class PostView:
    post_id: str
    user_id: str | None = None
    text: str | None = None
    url: str | None = None
    created_at: str | None = None
    first_seen_s: float = 0.0  # when the console first heard of the post (wall time)
    decisions: dict[int, dict] = dataclasses.field(default_factory=dict)  # revision -> decision
    label: dict | None = None  # the latest moderator label record
    latest: dict | None = None  # the decision of the highest revision
    decided_at_s: float | None = None  # when the latest decision was made (seconds); a queue is ordered by it
    size: int = POST_OVERHEAD  # bytes counted against the index's max_bytes
    decision_sizes: dict[int, int] = dataclasses.field(default_factory=dict)

    def set_latest(self) -> None:
        # cached: a queue read orders thousands of posts by it, and parsing each time would cost the page
        self.latest = self.decisions[max(self.decisions)] if self.decisions else None
        d = self.latest
        self.decided_at_s = None if d is None else seconds(d.get("decided_at")) or self.first_seen_s

    @property
    def waiting(self) -> bool:
        return self.label is None and (self.latest or {}).get("verdict") == "review"

    @property
    def blocked(self) -> bool:
        return (self.latest or {}).get("verdict") == "block"

    def listed(self, now_s: float) -> dict:
        """The summary with the text cut for a list."""
        out = self.summary(now_s)
        if out["text"] and len(out["text"]) > LIST_TEXT:
            out["text"], out["text_truncated"] = out["text"][:LIST_TEXT], True
        return out

    def summary(self, now_s: float) -> dict:
        d = self.latest or {}
        waited = None if self.decided_at_s is None else max(0.0, now_s - self.decided_at_s)
        return {"post_id": self.post_id, "user_id": self.user_id or d.get("user_id"), "text": self.text,
                "url": self.url, "verdict": d.get("verdict"), "spam_probability": d.get("spam_probability"),
                "text_probability": d.get("text_probability"), "revision": d.get("revision"),
                "degraded": d.get("degraded", False), "reasons": d.get("reasons", [])[:3],
                "waiting_s": None if waited is None else round(waited, 1),
                "label": (self.label or {}).get("label"), "labelled_by": (self.label or {}).get("moderator_id")}

    def detail(self, now_s: float) -> dict:
        out = self.summary(now_s)
        d = self.latest or {}
        out.update(reasons=d.get("reasons", []), features=d.get("features", {}), created_at=self.created_at,
                   decided_at=d.get("decided_at"), latency_ms=d.get("latency_ms"),
                   short_circuit=d.get("short_circuit"), model_versions=d.get("model_versions", {}),
                   revisions=[{"revision": r, "verdict": x.get("verdict"), "spam_probability": x.get("spam_probability"),
                               "decided_at": x.get("decided_at"), "degraded": x.get("degraded", False)}
                              for r, x in sorted(self.decisions.items())])
        return out


class _Ranked:
    """Members (post views) kept in a heap by a key, for "the first k" in O(k log n) instead of a walk of
    every member: a heap with lazy deletion (an entry stands only while it is its member's current one;
    others are dropped when they surface, and the heap is rebuilt when stale entries outnumber the members)."""

    def __init__(self, key):
        self.key = key
        self.members: dict[str, tuple] = {}  # post_id -> its current heap entry
        self._heap: list[tuple] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self.members)

    def set(self, view: PostView, member: bool) -> None:
        if not member:
            self.members.pop(view.post_id, None)
            return
        entry = self.members.get(view.post_id)
        if entry is None or entry[0] != self.key(view):
            self._seq += 1
            entry = self.members[view.post_id] = (self.key(view), self._seq, view.post_id)
            heapq.heappush(self._heap, entry)
            if len(self._heap) > 2 * len(self.members) + 1024:
                self._heap = list(self.members.values())
                heapq.heapify(self._heap)

    def discard(self, post_id: str) -> None:
        self.members.pop(post_id, None)

    def first(self, k: int) -> list[str]:
        found = []
        while self._heap and len(found) < k:
            entry = heapq.heappop(self._heap)
            if self.members.get(entry[2]) is entry:
                found.append(entry)
        for entry in found:
            heapq.heappush(self._heap, entry)
        return [entry[2] for entry in found]


class DecisionIndex:
    """Thread-safe: a Kafka thread applies records, HTTP threads read."""

    def __init__(self, max_posts: int = 50_000, clock=time.time, max_bytes: int = 256 * 2**20):
        self.max_posts, self.max_bytes = max_posts, max_bytes
        self.clock = clock
        self._posts: collections.OrderedDict[str, PostView] = collections.OrderedDict()  # oldest first
        # user -> their post ids in arrival order (a dict: forgetting one is O(1), a list's remove() is not)
        self._by_user: dict[str, dict[str, None]] = {}
        self._waiting = _Ranked(lambda v: v.decided_at_s or 0.0)  # the review queue, oldest decision first
        self._blocked = _Ranked(lambda v: -(v.decided_at_s or 0.0))  # recent blocks, newest first
        self.bytes = 0
        self._lock = threading.Lock()
        # Per second of the decisions' own decided_at, the last CHART_S: verdict counts and latency samples for
        # the live charts (a console that starts late, or reads a backlog at once, draws the past as it was).
        self._per_second: dict[int, dict[str, Any]] = {}
        self.counts = collections.Counter()  # records applied, by kind

    # -- applying records
    def _view(self, post_id: str) -> PostView:
        view = self._posts.get(post_id)
        if view is None:
            view = self._posts[post_id] = PostView(post_id, first_seen_s=self.clock())
            self.bytes += view.size
        return view

    def _grow(self, view: PostView, delta: int) -> None:
        view.size += delta
        self.bytes += delta

    def _settle(self, view: PostView) -> None:
        """After a record changed `view`: its place in the queue and the blocks, then the bounds."""
        self._waiting.set(view, view.waiting)
        self._blocked.set(view, view.blocked)
        # the newest post stays even when it alone is over max_bytes: its records were accepted by the pipeline
        while len(self._posts) > 1 and (len(self._posts) > self.max_posts or self.bytes > self.max_bytes):
            _, old = self._posts.popitem(last=False)
            self.bytes -= old.size
            self._waiting.discard(old.post_id)
            self._blocked.discard(old.post_id)
            posts = self._by_user.get(old.user_id) if old.user_id else None
            if posts is not None:
                posts.pop(old.post_id, None)
                if not posts:
                    del self._by_user[old.user_id]

    def _link_user(self, view: PostView, user_id: str | None) -> None:
        if user_id and view.user_id is None:
            view.user_id = str(user_id)
            self._by_user.setdefault(view.user_id, {})[view.post_id] = None
            self._grow(view, len(view.user_id))

    def add_post(self, post: dict) -> None:
        with self._lock:
            view = self._view(str(post["post_id"]))
            self._link_user(view, post.get("user_id"))
            before = _utf8(view.text) + _utf8(view.url) + _utf8(view.created_at)
            view.text, view.url, view.created_at = post.get("text"), post.get("url"), post.get("created_at")
            self._grow(view, _utf8(view.text) + _utf8(view.url) + _utf8(view.created_at) - before)
            self.counts["post"] += 1
            self._settle(view)

    def add_decision(self, decision: dict) -> None:
        with self._lock:
            view = self._view(str(decision["post_id"]))
            self._link_user(view, decision.get("user_id"))
            revision = decision.get("revision") if isinstance(decision.get("revision"), int) else 1
            view.decisions[revision] = decision  # a later copy of a revision replaces the earlier one
            size = len(orjson.dumps(decision, default=str))
            self._grow(view, size - view.decision_sizes.get(revision, 0))
            view.decision_sizes[revision] = size
            view.set_latest()
            self.counts["decision"] += 1
            self._chart(decision)
            self._settle(view)

    def _chart(self, decision: dict) -> None:
        now = self.clock()
        second = int(seconds(decision.get("decided_at")) or now)
        if second <= now - CHART_S:
            return
        bucket = self._per_second.get(second)
        if bucket is None:
            bucket = self._per_second[second] = {"allow": 0, "review": 0, "block": 0, "lat": []}
            if len(self._per_second) > 2 * CHART_S:  # forget seconds that left the window
                for old in [t for t in self._per_second if t <= now - CHART_S]:
                    del self._per_second[old]
        if decision.get("verdict") in schema.VERDICTS:
            bucket[decision["verdict"]] += 1
        if isinstance(decision.get("latency_ms"), (int, float)):
            bucket["lat"].append(decision["latency_ms"])

    def add_label(self, label: dict) -> None:
        with self._lock:
            view = self._view(str(label["post_id"]))
            self._link_user(view, label.get("user_id"))
            if view.label is None or str(label.get("created_at")) >= str(view.label.get("created_at")):
                before = 0 if view.label is None else len(orjson.dumps(view.label, default=str))
                view.label = label
                self._grow(view, len(orjson.dumps(label, default=str)) - before)
            self.counts["label"] += 1
            self._settle(view)

    # -- reading
    def queue(self, limit: int = 100) -> dict:
        """Posts to review (latest verdict review, no label), oldest decision first (at most MAX_LIST)."""
        limit = max(1, min(limit, MAX_LIST))
        with self._lock:
            now = self.clock()
            first = self._waiting.first(limit)
            return {"size": len(self._waiting), "posts": [self._posts[i].listed(now) for i in first]}

    def blocks(self, limit: int = 50) -> list[dict]:
        limit = max(1, min(limit, MAX_LIST))
        with self._lock:
            now = self.clock()
            return [self._posts[i].listed(now) for i in self._blocked.first(limit)]

    def post(self, post_id: str) -> dict | None:
        with self._lock:
            view = self._posts.get(post_id)
            return None if view is None else view.detail(self.clock())

    def user(self, user_id: str, limit: int = 50) -> dict:
        limit = max(1, min(limit, MAX_LIST))
        with self._lock:
            now = self.clock()
            ids = self._by_user.get(user_id, {})
            newest = list(itertools.islice(reversed(ids), limit))
            posts = [self._posts[i].listed(now) for i in newest if i in self._posts]
            verdicts = collections.Counter(p["verdict"] for p in posts)
            return {"user_id": user_id, "posts": posts, "verdicts": dict(verdicts), "known_posts": len(ids)}

    def search(self, q: str) -> dict:
        """A post_id or a user_id (exact)."""
        q = q.strip()
        return {"post": self.post(q), "user": self.user(q) if q in self._by_user else None}

    def stats(self, window_s: int = 120) -> dict:
        """Decisions per second by verdict and latency quantiles per second (by when each was decided), for the
        last `window_s` s (at most CHART_S)."""
        window_s = min(window_s, CHART_S)
        with self._lock:
            now = int(self.clock())
            rows = {t: (b["allow"], b["review"], b["block"], sorted(b["lat"]))
                    for t, b in self._per_second.items() if now - window_s < t <= now}
            queue_size = len(self._waiting)
        series = []
        for second in range(now - window_s + 1, now + 1):
            allow, review, block, lat = rows.get(second, (0, 0, 0, []))
            series.append({"t": second, "allow": allow, "review": review, "block": block,
                           "p50_ms": lat[len(lat) // 2] if lat else None,
                           "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None})
        return {"now": now, "series": series, "queue_size": queue_size, "posts_known": len(self._posts),
                "bytes_known": self.bytes, "records": dict(self.counts)}


def _utf8(text: Any) -> int:
    return len(text.encode("utf-8", "replace")) if isinstance(text, str) else 0


def seconds(rfc3339: Any) -> float | None:
    """An RFC 3339 time (as the pipeline writes them) in epoch seconds; None when absent or unreadable."""
    if not isinstance(rfc3339, str):
        return None
    try:
        return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
