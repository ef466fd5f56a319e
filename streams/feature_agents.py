"""Stateful feature agents: thin wiring of `features/` (pure logic) to topics and faust tables.

Each table has one stage agent reading its stage topic `features.<table>`, keyed by what that table
counts, so the table is co-partitioned with the only stream that updates it. Messages on a stage
topic are {"kind", "ctx"} (ctx = features.events.prepare_*), and for posts also the accumulated
"counts", the remaining "route" and the "envelope" (the post itself). A post walks its route
user -> url -> domain -> ip -> post; the last stage assembles the feature map (features.vector) and
hands the post to the batching agent on `posts.enriched`.

Re-decision: the post table keeps the snapshot each decision was made from. When a report brings the
post's reports to MODPIPE_REDECIDE_REPORTS, or a domain ban reaches it through the domain table's list
of recent posts, the post stage decides again from the snapshot and publishes revision + 1.

Stages take events in batches (up to STAGE_BATCH, or what arrived within STAGE_WAIT_S): each key's
state is loaded once per batch, updated by its events in order and written once (`TableBatch`), so
a hot key costs one changelog record per batch. Sends are not awaited one by one: faust flushes the
producer before it commits offsets, so at-least-once holds, and the states in features.state ignore
an event they have already counted.
"""

from __future__ import annotations

import orjson

from features import events as fe
from features.state import DEFAULT_LIMITS, ban_features
from features.vector import assemble
from modpipe import log, schema
from modpipe.decision.engine import cascade
from modpipe.decision.verdict import Decider
from streams import metrics
from streams.app import Pipeline
from streams.bans import BanRegistry
from streams.dead_letters import send_dead_letter
from streams.table_batch import TableBatch

_log = log.get(__name__)

STAGE_BATCH = 256     # events per table-stage batch
STAGE_WAIT_S = 0.005  # longest wait to fill one (added once per stage hop when traffic is light)
DECODERS = {"report": schema.decode_report, "engagement": schema.decode_engagement, "label": schema.decode_label}


def post_route(ctx: dict) -> list[list[str]]:
    """The stages a post visits, in order: only those whose key it has."""
    return [[table, key] for table, key in fe.routes("post", ctx)]


async def send_to_stage(pipe: Pipeline, table: str, key: str, message: dict):
    return await pipe.stages[table].send(key=key.encode(), value=orjson.dumps(message))


async def start_post(pipe: Pipeline, envelope: dict):
    """Ingest hands a valid post to its first stage."""
    ctx = fe.prepare_post(envelope["post"])
    route = post_route(ctx)
    table, key = route.pop(0)
    return await send_to_stage(pipe, table, key, {"kind": "post", "ctx": ctx, "envelope": envelope,
                                                  "counts": {}, "route": route})


async def feed_back_decision(pipe: Pipeline, ctx: dict, spam: bool, revision: int,
                             snapshot: dict | None = None) -> list:
    """The pipeline's own verdict counts towards user_spam_posts / ip_spam_posts of later posts; the post
    table also keeps the snapshot the verdict was made from, for a re-decision."""
    dctx = fe.prepare_decision(ctx, spam, revision=revision)
    return [await send_to_stage(pipe, table, key, {"kind": "decision",
                                                   "ctx": {**dctx, "snapshot": snapshot} if table == fe.POST else dctx})
            for table, key in fe.routes("decision", dctx)]


async def publish_decision(pipe: Pipeline, record: dict, ctx: dict, received_at_ms: int) -> list:
    """Publish a decision record and feed it back to the tables; returns the pending deliveries."""
    snapshot = {"post": {"post_id": record["post_id"], "user_id": record["user_id"]},
                "received_at_ms": received_at_ms, "features": record["features"], "revision": record["revision"]}
    deliveries = [await pipe.decisions.send(key=record["post_id"].encode(), value=schema.dumps(record))]
    deliveries += await feed_back_decision(pipe, ctx, record["verdict"] == "block", record["revision"], snapshot)
    metrics.DECISIONS.labels(record["verdict"]).inc()
    if record["short_circuit"]:
        metrics.SHORTCUTS.labels(record["short_circuit"]).inc()
    return deliveries


def attach_feature_agents(pipe: Pipeline, bans: BanRegistry, decider: Decider, model_versions: dict,
                          redecide_reports: int) -> None:
    app, limits = pipe.app, DEFAULT_LIMITS
    is_banned = bans.is_banned

    async def redecide(key: str, state, request: dict) -> None:
        """Decide a post again from its stored snapshot (reports crossed the threshold, or a later ban)."""
        features = request["features"]
        verdict = cascade(decider, [features])[0]
        record = schema.decision(
            post=request["post"], verdict=verdict.verdict, spam_probability=verdict.spam_probability,
            text_probability=features.get("text_probability"), reasons=verdict.reasons, features=features,
            short_circuit=verdict.short_circuit, model_versions=model_versions,
            received_at_ms=request["received_at_ms"], decided_at_ms=schema.now_ms(), revision=request["revision"])
        ctx = {"post_id": key, "user_id": state.info["user_id"], "ip": state.info["ip"], "ts": state.info["ts"]}
        await publish_decision(pipe, record, ctx, request["received_at_ms"])
        metrics.REDECISIONS.labels(request["reason"]).inc()
        _log.info("post decided again", extra={"post_id": key, "reason": request["reason"],
                                               "revision": request["revision"], "verdict": verdict.verdict})

    def make_stage(table_name: str):
        table = pipe.tables[table_name]

        async def stage(stream):
            async for events in stream.take_events(STAGE_BATCH, within=STAGE_WAIT_S):
                batch = TableBatch(table_name, table, limits)
                for event in events:
                    key = None
                    try:
                        key = event.key.decode()
                        await process(batch, event, orjson.loads(event.value), key)
                    except Exception as exc:  # noqa: BLE001 - one bad event must not stall the partition
                        _log.exception("feature stage failed on an event", extra={"table": table_name})
                        if key is not None:
                            batch.rebuild(key, event)
                        await send_dead_letter(pipe, event, exc)
                metrics.STATE_WRITES.labels(table_name).inc(batch.flush())

        async def process(batch: TableBatch, event, message: dict, key: str) -> None:
            kind, ctx = message["kind"], message["ctx"]
            state = batch.state(key, event)
            update = state.apply(kind, ctx)
            batch.done(key, event, ("apply", kind, ctx), update.changed)
            request = state.redecision(redecide_reports) if table_name == fe.POST and kind != "post" else None
            if request:
                batch.done(key, event, ("redecide", redecide_reports), True)
                await redecide(key, state, request)
            for f_table, f_key, f_kind, f_ctx in update.followups:
                await send_to_stage(pipe, f_table, f_key, {"kind": f_kind, "ctx": f_ctx})
            if kind != "post":
                return
            message["counts"].update(update.features)
            if message["route"]:
                next_table, next_key = message["route"].pop(0)
                await send_to_stage(pipe, next_table, next_key, message)
                return
            counts = {**message["counts"], **ban_features(ctx, is_banned)}
            envelope = message["envelope"]
            envelope["features"] = assemble(envelope["post"], counts)
            envelope["ctx"] = ctx
            await pipe.enriched_posts.send(key=ctx["post_id"].encode(), value=orjson.dumps(envelope))

        stage.__name__ = f"features_{table_name}"
        return stage

    for name in pipe.stages:
        app.agent(pipe.stages[name], name=f"features-{name}")(make_stage(name))

    def make_side_input(kind: str):
        decode = DECODERS[kind]

        async def side_input(stream):
            async for event in stream.events():
                try:
                    raw = decode(event.value)
                except schema.InvalidMessage as exc:
                    await send_dead_letter(pipe, event, exc)
                    continue
                metrics.EVENTS_CONSUMED.labels(kind).inc()
                ctx = fe.PREPARE[kind](raw)
                for table, key in fe.routes(kind, ctx):
                    await send_to_stage(pipe, table, key, {"kind": kind, "ctx": ctx})

        side_input.__name__ = f"ingest_{kind}"
        return side_input

    for kind, topic in pipe.side_inputs.items():
        app.agent(topic, name=f"ingest-{kind}")(make_side_input(kind))

    @app.agent(pipe.bans, name="ingest-ban")
    async def ingest_ban(stream):
        """Validates bans and dead-letters bad ones; every worker's BanRegistry applies the valid ones."""
        async for event in stream.events():
            try:
                raw = schema.decode_ban(event.value)
            except schema.InvalidMessage as exc:
                await send_dead_letter(pipe, event, exc)
                continue
            metrics.EVENTS_CONSUMED.labels("ban").inc()
            _log.info("ban received", extra={"kind": raw["kind"], "value": raw["value"], "action": raw["action"]})
            # Every worker's BanRegistry applies it to new posts; the domain table finds the posts decided
            # before it, so they are decided again.
            ctx = fe.prepare_ban(raw)
            for table, key in fe.routes("ban", ctx):
                if table != fe.BANS:
                    await send_to_stage(pipe, table, key, {"kind": "ban", "ctx": ctx})
