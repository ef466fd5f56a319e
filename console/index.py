"""What the review console knows, built from the `posts`, `decisions` and `labels` topics (pure: no Kafka).

Per post: its text and link (from `posts`), every decision revision (from `decisions`, the last record of a
revision standing, so a record read twice changes nothing), and the
moderator's label. The review queue is the posts whose latest decision is `review` and that nobody has
labelled, oldest waiting first; recent blocks likewise. A user's posts are listed newest first.

Bounded: at most `max_posts` posts are kept, the oldest forgotten first (a post and everything about it),
so a console that follows a busy platform for days keeps its memory.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import threading
import time
from typing import Any

from modpipe import schema

CHART_S = 600  # how far back the charts can look


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

    @property
    def latest(self) -> dict | None:
        return self.decisions[max(self.decisions)] if self.decisions else None

    @property
    def decided_at_s(self) -> float | None:
        """When the latest decision was made (seconds); a queue is ordered by it."""
        d = self.latest
        return None if d is None else seconds(d.get("decided_at")) or self.first_seen_s

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


class DecisionIndex:
    """Thread-safe: a Kafka thread applies records, HTTP threads read."""

    def __init__(self, max_posts: int = 50_000, clock=time.time):
        self.max_posts = max_posts
        self.clock = clock
        self._posts: collections.OrderedDict[str, PostView] = collections.OrderedDict()  # oldest first
        self._by_user: dict[str, list[str]] = collections.defaultdict(list)
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
            while len(self._posts) > self.max_posts:
                _, old = self._posts.popitem(last=False)
                if old.user_id and old.post_id in self._by_user.get(old.user_id, ()):
                    self._by_user[old.user_id].remove(old.post_id)
                    if not self._by_user[old.user_id]:
                        del self._by_user[old.user_id]
        return view

    def _link_user(self, view: PostView, user_id: str | None) -> None:
        if user_id and view.user_id is None:
            view.user_id = user_id
            self._by_user[user_id].append(view.post_id)

    def add_post(self, post: dict) -> None:
        with self._lock:
            view = self._view(str(post["post_id"]))
            self._link_user(view, post.get("user_id"))
            view.text, view.url, view.created_at = post.get("text"), post.get("url"), post.get("created_at")
            self.counts["post"] += 1

    def add_decision(self, decision: dict) -> None:
        with self._lock:
            view = self._view(str(decision["post_id"]))
            self._link_user(view, decision.get("user_id"))
            revision = decision.get("revision") if isinstance(decision.get("revision"), int) else 1
            view.decisions[revision] = decision  # a later copy of a revision replaces the earlier one
            self.counts["decision"] += 1
            self._chart(decision)

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
                view.label = label
            self.counts["label"] += 1

    # -- reading
    def queue(self, limit: int = 100) -> dict:
        """Posts to review (latest verdict review, no label), oldest decision first."""
        with self._lock:
            now = self.clock()
            waiting = [v for v in self._posts.values()
                       if v.label is None and (v.latest or {}).get("verdict") == "review"]
            waiting.sort(key=lambda v: v.decided_at_s or 0.0)
            return {"size": len(waiting), "posts": [v.summary(now) for v in waiting[:limit]]}

    def blocks(self, limit: int = 50) -> list[dict]:
        with self._lock:
            now = self.clock()
            blocked = [v for v in self._posts.values() if (v.latest or {}).get("verdict") == "block"]
            blocked.sort(key=lambda v: v.decided_at_s or 0.0, reverse=True)
            return [v.summary(now) for v in blocked[:limit]]

    def post(self, post_id: str) -> dict | None:
        with self._lock:
            view = self._posts.get(post_id)
            return None if view is None else view.detail(self.clock())

    def user(self, user_id: str, limit: int = 50) -> dict:
        with self._lock:
            now = self.clock()
            ids = self._by_user.get(user_id, [])
            posts = [self._posts[i].summary(now) for i in reversed(ids[-limit:]) if i in self._posts]
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
            queue_size = sum(1 for v in self._posts.values()
                             if v.label is None and (v.latest or {}).get("verdict") == "review")
        series = []
        for second in range(now - window_s + 1, now + 1):
            allow, review, block, lat = rows.get(second, (0, 0, 0, []))
            series.append({"t": second, "allow": allow, "review": review, "block": block,
                           "p50_ms": lat[len(lat) // 2] if lat else None,
                           "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None})
        return {"now": now, "series": series, "queue_size": queue_size, "posts_known": len(self._posts),
                "records": dict(self.counts)}


def seconds(rfc3339: Any) -> float | None:
    """An RFC 3339 time (as the pipeline writes them) in epoch seconds; None when absent or unreadable."""
    if not isinstance(rfc3339, str):
        return None
    try:
        return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
