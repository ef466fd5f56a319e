"""The feature stages as plain classes: items in, table states updated, items out. No Kafka here.

A post walks its route of stages (modpipe.features.events.STAGES): user -> link (url + domain) -> ip -> post.
At each stage it updates that stage's tables and collects their share of its features (`counts`);
the post stage adds the bans and assembles the feature map (modpipe.features.vector), and the post is ready
for the text model and the decision, unless the post table already held its id (a re-send). A post its first
table cannot tell new from re-sent (dated at or below the ids it keeps) goes along its route to the post table
first, applying nothing, and walks it again with the answer (`_ask_post_table`; modpipe.features.state.count_post). Side events (reports, engagements,
labels, decisions, bans) go straight to the stages of the tables they update; states may ask for follow-ups on
other tables (a label reaches the ip table through the post table, a ban the posts of its domain) and the post
table may ask for a re-decision.

Each `Stage` applies items with `TableStates` (one write per changed key per batch) and collects what
they produce; an item's outputs are kept only if the whole item succeeded (a failed item leaves no
trace in the tables and sends nothing; the wiring dead-letters it). The wiring (`agents.py`) decodes
bundles, calls `apply`, flushes the states and publishes `outputs` through the outbox.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from modpipe.features import events as fe
from modpipe.features.state import CHECKED, POST_CHECK, RESENT, Limits, ban_features, mark_post, post_is_new
from modpipe.features.vector import assemble
from modpipe.streams.state.table_states import TableStates


@dataclasses.dataclass
class ReadyPost:
    """A post with its feature map, waiting for the text model and the decision."""
    post: dict
    received_at_ms: int
    ctx: dict
    features: dict
    source: Any = None  # the wiring's handle (a `Pending`) released once the decision is delivered
    partition: int = -1  # its post-stage partition (-1: not worked out yet; streams/moderation/carried.py)
    carried: bool = False  # kept as state by a checkpoint: its decision goes with its record's tombstone
    dropped: bool = False  # its partition went to another worker: never decided here


@dataclasses.dataclass
class Redecision:
    """The post table asked to decide a post again from its stored snapshot."""
    post_id: str
    ctx: dict  # post_id, user_id, ip, ts: where the verdict is fed back
    request: dict  # modpipe.features.state.PostState.redecision()


@dataclasses.dataclass
class StageOutputs:
    """What a batch of items produced: items for stage topics, posts ready to decide, re-decisions."""
    items: list[tuple[str, str, dict]] = dataclasses.field(default_factory=list)  # (stage, partition key, item)
    ready: list[ReadyPost] = dataclasses.field(default_factory=list)
    redecisions: list[Redecision] = dataclasses.field(default_factory=list)
    resent: int = 0  # posts sent again by the platform: already decided, so not decided again
    checked: int = 0  # posts whose first table could not tell new from re-sent: sent to the post table first


def post_item(post: dict, received_at_ms: int) -> tuple[str, str, dict]:
    """A valid post as it enters the stages: (first stage, its partition key, item)."""
    ctx = fe.prepare_post(post)
    route = [[stage, pkey, [list(t) for t in targets]] for stage, pkey, targets in fe.hops(fe.routes("post", ctx), ctx)]
    stage, pkey, targets = route.pop(0)
    return stage, pkey, {"kind": "post", "ctx": ctx, "to": targets, "post": post,
                         "received_at_ms": received_at_ms, "counts": {}, "route": route}


def event_items(kind: str, ctx: dict) -> list[tuple[str, str, dict]]:
    """A side event's items: one per stage hop of the tables it updates directly. (The bans table has no
    stage: every worker reads the ban log itself, streams/moderation/bans.py.)"""
    direct = [(table, key) for table, key in fe.routes(kind, ctx) if table in fe.STAGE_OF]
    return [(stage, pkey, {"kind": kind, "ctx": ctx, "to": [list(t) for t in targets]})
            for stage, pkey, targets in fe.hops(direct, ctx)]


def decision_items(post_ctx: dict, spam: bool, revision: int, snapshot: dict | None) -> list[tuple[str, str, dict]]:
    """The pipeline's verdict fed back to the tables that count it; the post table also keeps the snapshot
    the verdict was made from, for a re-decision."""
    dctx = fe.prepare_decision(post_ctx, spam, revision=revision)
    out = []
    for stage, pkey, targets in fe.hops(fe.routes("decision", dctx), dctx):
        ctx = {**dctx, "snapshot": snapshot} if stage == "post" else dctx
        out.append((stage, pkey, {"kind": "decision", "ctx": ctx, "to": [list(t) for t in targets]}))
    return out


class Stage:
    """One stage's tables on this worker."""

    def __init__(self, name: str, tables: dict[str, Any], limits: Limits, *, is_banned: Callable[[str], bool],
                 redecide_reports: int = 0, writers: dict[str, Callable] | None = None,
                 cached_keys: dict[str, int] | None = None, cache_bytes: int | None = None):
        self.name = name
        writers, cached_keys = writers or {}, cached_keys or {}
        self.states = {t: TableStates(t, tables[t], limits, write=writers.get(t), read=getattr(writers.get(t), "read", None),
                                      **({"cached_keys": cached_keys[t]} if t in cached_keys else {}),
                                      **({"cache_bytes": cache_bytes} if cache_bytes is not None else {}))
                       for t in fe.STAGES[name]}
        self.is_banned = is_banned
        self.redecide_reports = redecide_reports

    def apply(self, item: dict, event) -> StageOutputs:
        """Apply one item under `event` (the record it came in); raises after undoing its table changes."""
        out = StageOutputs()
        kind, ctx = item["kind"], item["ctx"]
        # a post on its way to the post table, to ask whether its id is new (its first table could not tell)
        check = kind == "post" and item.get("check", False)
        if check and self.name != "post":
            self._forward_post(item, out, None)  # passing through: nothing applied before the answer
            return out
        done = []  # (states, key, op, changed): recorded once the whole item succeeded
        marks = kind == "post" and RESENT not in ctx  # this stage judges the post: its first table or the check
        new = None  # at the post table, the end of a post's route: whether the post gets its decision
        try:
            for table, key in item["to"]:
                states = self.states[table]
                state = states.state(key, event)
                applied = POST_CHECK if check else kind
                # the table that judges a post sees its ctx before the re-send mark (set below, then never changed):
                # its op keeps a copy, so a rebuild redoes it with the ctx that table saw
                op = ("apply", applied, dict(ctx) if kind == "post" and RESENT not in ctx else ctx)
                done.append((states, key, op, False))
                update = state.apply(applied, ctx)
                done[-1] = (states, key, op, update.changed)
                if kind == "post":
                    if update.new is None:  # nothing applied: the post table first, then this hop again
                        self._ask_post_table(item, out)
                        break
                    mark_post(ctx, update.new, checked=check)
                    if table == fe.POST and not check:
                        new = post_is_new(ctx, update)
                if table == fe.POST and kind != "post":
                    request = state.redecision(self.redecide_reports)
                    if request:
                        done.append((states, key, ("redecide", self.redecide_reports), True))
                        info = state.info or {}
                        out.redecisions.append(Redecision(key, {"post_id": key, "user_id": info.get("user_id"),
                                                                "ip": info.get("ip"), "ts": info.get("ts")}, request))
                for f_table, f_key, f_kind, f_ctx in update.followups:
                    stage, pkey, targets = fe.hops([(f_table, f_key)], f_ctx)[0]
                    out.items.append((stage, pkey, {"kind": f_kind, "ctx": f_ctx, "to": [list(t) for t in targets]}))
                if kind == "post":
                    item["counts"].update(update.features)
            else:
                if kind == "post":
                    self._forward_post(item, out, new)
        except Exception:
            for states, key, _, _ in done:  # back to the state before this item (earlier items kept)
                states.rebuild(key, event)
            if marks:
                ctx.pop(RESENT, None)
                ctx.pop(CHECKED, None)
            raise
        for states, key, op, changed in done:
            states.done(key, event, op, changed)
        return out

    def _ask_post_table(self, item: dict, out: StageOutputs) -> None:
        """The post's first table cannot tell whether it is new (dated at or below the ids it keeps): the post goes
        to the post table, which keeps every post by id, and comes back to this hop with the answer. It goes there
        along its own route, applying nothing on the way: a copy of it ahead on that route (the original, judged
        new by this table's ids and not yet at the post table) stays ahead, each hop being one partition in order."""
        ctx = item["ctx"]
        table, key = item["to"][0]
        here = [self.name, fe.partition_key(table, key, ctx), item["to"]]
        route = [list(hop) for hop in item["route"]]  # ends with the post stage's hop
        stage, pkey, targets = route[0]
        out.items.append((stage, pkey, {**item, "to": targets, "check": True,
                                        "route": [*route[1:], here, *item["route"]]}))
        out.checked += 1

    def _forward_post(self, item: dict, out: StageOutputs, new: bool | None) -> None:
        if item["route"]:
            stage, pkey, targets = item["route"].pop(0)
            forward = {**item, "to": targets}
            if self.name == "post":
                forward.pop("check", None)  # answered: the post walks its route again, counted
            out.items.append((stage, pkey, forward))
            return
        ctx = item["ctx"]
        if not new:
            # The post id was decided when it first came (a producer's retry after an epoch bump, a replay):
            # one decision per post for the platform, and the tables counted it once already.
            out.resent += 1
            return
        counts = {**item["counts"], **ban_features(ctx, self.is_banned)}
        out.ready.append(ReadyPost(post=item["post"], received_at_ms=item["received_at_ms"], ctx=ctx,
                                   features=assemble(item["post"], counts)))

    @property
    def batch_bytes(self) -> int:
        """Estimated bytes of the decoded states used since the last flush."""
        return sum(states.batch_bytes for states in self.states.values())

    def flush(self, pending=None) -> dict[str, int]:
        """End of a batch: write each changed state once (under `pending`). Returns writes per table."""
        return {t: states.flush(pending) for t, states in self.states.items()}

    def expire(self, pending=None) -> dict[str, int]:
        """After a flush: forget the keys past their table's retention. Returns keys forgotten per table."""
        return {t: states.expire(pending) for t, states in self.states.items()}

    def invalidate(self) -> None:
        for states in self.states.values():
            states.invalidate()
