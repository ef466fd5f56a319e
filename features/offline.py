"""Reference computation of every post's features over an ordered event list, without Kafka or the stream
runtime's tables.

The per-event logic is the streaming logic: `modpipe.features.events` prepares and routes, `modpipe.features.state`
applies, `modpipe.features.vector.assemble` builds the map. Only storage differs (dicts here, which never forget a
key: the streaming tables forget keys not written for their retention, streams/state/tables.py, so the two agree
while no key goes unwritten that long). `apply_event` is storage-agnostic and can also drive a single-process
pipeline.

Events are (kind, raw_event) pairs, kind in modpipe.features.events.EVENT_KINDS. A `decision` raw event is
{post_id, user_id, ip, spam, created_at?, revision?}; or pass `decide(post, features) -> bool | None` to feed a
decision back right after each new post, as the pipeline does. A post whose id came before is a re-send: it
counts nowhere and gets no decision (`apply_post`), whatever its created_at.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from modpipe.features.events import BANS, POST, PREPARE, normalize_ip, parse_ts, prepare_decision, routes
from modpipe.features.state import (
    DEFAULT_LIMITS,
    POST_CHECK,
    Limits,
    ban_features,
    load_state,
    mark_post,
    new_state,
    post_is_new,
)
from modpipe.features.vector import assemble


class Store(Protocol):
    def get(self, table: str, key: str): ...  # a state object (new when the key is absent)
    def put(self, table: str, key: str, state) -> None: ...


def apply_event(kind: str, ctx: dict, store: Store) -> dict[str, Any]:
    """Apply one prepared event to every table it touches, then the follow-ups it produces.

    Returns the merged `Update.features` (non-empty for posts: the table counts of `assemble`)."""
    if kind == "post":
        return apply_post(ctx, store)[0]
    return _apply(kind, ctx, store, [(table, key, kind, ctx) for table, key in routes(kind, ctx)])


def apply_post(ctx: dict, store: Store) -> tuple[dict[str, Any], bool]:
    """Apply a prepared post as the chain of stages does: (its table counts, whether it is new and decided).

    Its first table judges it by its ids (modpipe.features.state.count_post); one it cannot tell (dated at or
    below its mark) goes to the post table first, which claims its id, then back to that table; the post table
    has the last word."""
    ctx = dict(ctx)  # takes the re-send mark of the table that judges it (modpipe.features.state.mark_post)
    out: dict[str, bool] = {}
    counts = _apply("post", ctx, store, [(table, key, "post", ctx) for table, key in routes("post", ctx)], out)
    counts.update(ban_features(ctx, lambda key: store.get(BANS, key).banned))
    return counts, out["new"]


def _apply(kind: str, ctx: dict, store: Store, queue: list, out: dict | None = None) -> dict[str, Any]:
    counts: dict[str, Any] = {}
    while queue:
        table, key, k, c = queue.pop(0)
        state = store.get(table, key)
        update = state.apply(k, c)
        store.put(table, key, state)
        if c is ctx and k in ("post", POST_CHECK):
            if update.new is None:  # its first table cannot tell: the post table first, then that table again
                queue[:0] = [(POST, ctx["post_id"], POST_CHECK, ctx), (table, key, k, ctx)]
                continue
            mark_post(ctx, update.new, checked=k == POST_CHECK)
            if k == "post" and table == POST and out is not None:
                out["new"] = post_is_new(ctx, update)
        counts.update(update.features)
        queue.extend(update.followups)  # after the direct routes: a post's own features never see them
    return counts


class DictStore:
    """Tables as dicts of state objects; `roundtrip=True` stores JSON text instead, exercising
    to_dict/from_dict on every event as a table restored from its changelog does (streams/state/tables.py)."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, roundtrip: bool = False):
        self.limits, self.roundtrip = limits, roundtrip
        self.tables: dict[str, dict[str, Any]] = {}

    def get(self, table: str, key: str):
        value = self.tables.get(table, {}).get(key)
        if value is None:
            return new_state(table, self.limits)
        return load_state(table, json.loads(value), self.limits) if self.roundtrip else value

    def put(self, table: str, key: str, state) -> None:
        self.tables.setdefault(table, {})[key] = json.dumps(state.to_dict()) if self.roundtrip else state

    def dump(self) -> dict[str, dict[str, dict]]:
        """Every table as plain dicts (comparable across stores)."""
        return {t: {k: (json.loads(v) if self.roundtrip else v.to_dict()) for k, v in rows.items()}
                for t, rows in self.tables.items()}


@dataclasses.dataclass
class OfflineResult:
    features: dict[str, dict[str, Any]]  # post_id -> features map of its decision (re-sends get none)
    store: DictStore
    decided: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # post_id -> decisions


def prepare_decision_event(raw: dict) -> dict:
    ctx = {"post_id": str(raw["post_id"]), "user_id": raw.get("user_id") and str(raw["user_id"]),
           "ip": normalize_ip(raw.get("ip")), "ts": parse_ts(raw.get("created_at")) or 0}
    return prepare_decision(ctx, bool(raw.get("spam")), raw.get("created_at"), revision=raw.get("revision"))


def compute(events: Iterable[tuple[str, dict]], *, limits: Limits = DEFAULT_LIMITS, roundtrip: bool = False,
            decide: Callable[[dict, dict], bool | None] | None = None) -> OfflineResult:
    store = DictStore(limits, roundtrip)
    result = OfflineResult({}, store)
    for kind, raw in events:
        ctx = prepare_decision_event(raw) if kind == "decision" else PREPARE[kind](raw)
        if kind != "post":
            apply_event(kind, ctx, store)
            continue
        counts, new = apply_post(ctx, store)
        if not new:  # a re-send: its post was decided when it first came
            continue
        features = assemble(raw, counts)
        result.features.setdefault(ctx["post_id"], features)
        result.decided[ctx["post_id"]] += 1
        if decide is not None:
            verdict = decide(raw, features)
            if verdict is not None:
                apply_event("decision", prepare_decision(ctx, verdict, revision=1), store)
    return result
