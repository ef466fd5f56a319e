"""The faust agents: thin wiring between topics and the plain logic in `stages.py` and `decisions.py`.

ingest            posts -> decode + validate -> the user stage, in place when the record already sits
                  on its user's partition (else through features.user) -> the post's next stage | posts.dlq
features-<stage>  bundles of items -> `Stage.apply` (user; link = url + domain; ip; post) -> the next
                  stages; the post stage hands ready posts to the `DecisionBatcher` -> decisions, and
                  the verdict back to the stage topics
ingest-<kind>     reports, engagements, labels, bans -> decode + validate -> the stages of the tables
                  they update | posts.dlq (every worker also reads the ban log itself: bans.py)

Every agent takes what is ready (`take_ready`) as one round: it applies the round's events, writes
each changed table state once, and publishes one bundle record per destination partition through the
outbox, all without awaiting anything. The round's input events are acked (so committed) only when
everything they produced is delivered: stage bundles, dead letters, and for posts their decisions
(`outbox.Pending`). A worker killed at any point loses nothing; what it had not committed is
processed again, and the states ignore events they have already counted.
"""

from __future__ import annotations

import asyncio

import orjson

from features import events as fe
from features.state import DEFAULT_LIMITS
from modpipe import log, schema
from modpipe.decision.verdict import Decider
from modpipe.settings import Settings
from streams import kafka_compat, metrics
from streams.app import Pipeline
from streams.bans import BanRegistry
from streams.bundles import Bundler, decode_bundle, partition_for
from streams.dead_letters import event_timestamp_ms, send_dead_letter
from streams.decisions import DecisionBatcher, Publisher
from streams.outbox import Outbox, Pending
from streams.scoring import TextScorer
from streams.stages import Stage, StageOutputs, event_items, post_item
from streams.table_states import ChangelogWriter
from streams.take import take_ready

_log = log.get(__name__)

ROUND_MAX = 256  # records handled per round at most (a stage record is a bundle of many items)
DECODERS = {"report": schema.decode_report, "engagement": schema.decode_engagement, "label": schema.decode_label}


class Wiring:
    """What the agents share: the stages' tables, the outbox, the decision batcher."""

    def __init__(self, pipe: Pipeline, settings: Settings, scorer: TextScorer, decider: Decider,
                 bans: BanRegistry, outbox: Outbox):
        self.pipe, self.settings, self.decider, self.outbox = pipe, settings, decider, outbox
        self.topics = pipe.topics
        writers = {name: ChangelogWriter(table, outbox) for name, table in pipe.tables.items()}
        outbox.after_delivery += [writer.persist_offsets for writer in writers.values()]
        self.stages = {name: Stage(name, pipe.tables, DEFAULT_LIMITS, is_banned=bans.is_banned,
                                   redecide_reports=settings.redecide_reports, writers=writers)
                       for name in fe.STAGES}
        model_versions = {"text_model": "off" if scorer.disabled else scorer.model_version,
                          "decider": decider.version}
        self.publisher = Publisher(outbox, pipe.topics, pipe.partitions, model_versions)
        self.batcher = DecisionBatcher(scorer, decider, self.publisher, max_batch=settings.max_batch,
                                       max_wait_s=settings.max_wait_ms / 1000, max_inflight=settings.max_inflight,
                                       on_error=self.crash)

    def crash(self, exc: Exception) -> None:
        """Stop the worker: what is not acked is processed again after the restart (at-least-once)."""
        asyncio.ensure_future(self.pipe.app.crash(exc))

    def route(self, bundler: Bundler, outputs: StageOutputs) -> None:
        for stage, pkey, item in outputs.items:
            bundler.add(self.topics.stages[stage], pkey, item)

    def dead_letter(self, event, error: Exception, pending: Pending, raw: bytes | None = None) -> None:
        send_dead_letter(self.outbox, self.topics.dead_letters, event, error, pending, raw)

    def round(self, stream, events) -> tuple[Pending, Bundler]:
        return Pending(stream, events, on_error=self.crash), Bundler(self.pipe.partitions)

    def finish(self, bundler: Bundler, pending: Pending) -> None:
        self.publisher.send_bundles(bundler, pending)
        pending.seal()


def attach_agents(pipe: Pipeline, settings: Settings, scorer: TextScorer, decider: Decider, bans: BanRegistry,
                  outbox: Outbox) -> Wiring:
    app = pipe.app
    w = Wiring(pipe, settings, scorer, decider, bans, outbox)
    partitions = pipe.partitions

    @app.agent(pipe.posts, name="ingest")
    async def ingest(stream):
        user = w.stages["user"]
        async for events in take_ready(stream, ROUND_MAX):
            pending, bundler = w.round(stream, events)
            for event in events:
                metrics.POSTS_CONSUMED.inc()
                try:
                    post = schema.decode_post(event.value, settings.max_text_chars)
                    stage, pkey, item = post_item(post, event_timestamp_ms(event))
                    if stage == "user" and event.message.partition == partition_for(pkey, partitions):
                        w.route(bundler, user.apply(item, event))  # the record sits on its user's partition
                    else:
                        bundler.add(w.topics.stages[stage], pkey, item)
                except schema.InvalidMessage as exc:
                    w.dead_letter(event, exc, pending)
                except Exception as exc:  # noqa: BLE001 - one bad post must not stall the partition
                    _log.exception("ingest failed on a post")
                    w.dead_letter(event, exc, pending)
            _count_writes(user.flush(pending))
            w.finish(bundler, pending)

    def make_stage_agent(name: str):
        stage = w.stages[name]

        async def stage_agent(stream):
            async for events in take_ready(stream, ROUND_MAX):
                pending, bundler = w.round(stream, events)
                out = StageOutputs()
                for event in events:
                    try:
                        items = decode_bundle(event.value)
                    except Exception as exc:  # noqa: BLE001 - only if someone else writes to our topic
                        w.dead_letter(event, exc, pending)
                        continue
                    for item in items:
                        try:
                            out.extend(stage.apply(item, event))
                        except Exception as exc:  # noqa: BLE001 - one bad item must not stall the partition
                            _log.exception("feature stage failed on an item", extra={"stage": name})
                            w.dead_letter(event, exc, pending, raw=orjson.dumps(item))
                _count_writes(stage.flush(pending))
                w.route(bundler, out)
                if out.redecisions:
                    w.publisher.redecide(decider, out.redecisions, bundler, pending)
                for post in out.ready:  # each holds the round's events until its decision is delivered
                    post.source = pending
                pending.hold(len(out.ready))
                w.batcher.submit(out.ready)
                w.finish(bundler, pending)

        stage_agent.__name__ = f"features_{name}"
        return stage_agent

    for name, topic in pipe.stages.items():
        app.agent(topic, name=f"features-{name}")(make_stage_agent(name))

    def make_side_input(kind: str):
        decode = DECODERS.get(kind, schema.decode_ban)

        async def side_input(stream):
            async for events in take_ready(stream, ROUND_MAX):
                pending, bundler = w.round(stream, events)
                for event in events:
                    try:
                        raw = decode(event.value)
                    except schema.InvalidMessage as exc:
                        w.dead_letter(event, exc, pending)
                        continue
                    metrics.EVENTS_CONSUMED.labels(kind).inc()
                    ctx = fe.PREPARE[kind](raw)
                    if kind == "ban":
                        # Every worker's BanRegistry applies it to new posts; the domain table finds the
                        # posts decided before it, so they are decided again.
                        _log.info("ban received", extra={"kind": raw["kind"], "value": raw["value"],
                                                         "action": raw["action"]})
                    for stage, pkey, item in event_items(kind, ctx):
                        bundler.add(w.topics.stages[stage], pkey, item)
                w.finish(bundler, pending)

        side_input.__name__ = f"ingest_{kind}"
        return side_input

    for kind, topic in {**pipe.side_inputs, "ban": pipe.bans}.items():
        app.agent(topic, name=f"ingest-{kind}")(make_side_input(kind))

    inputs = set(pipe.topics.inputs())

    @app.on_partitions_revoked.connect
    async def on_revoked(app, revoked, **kwargs) -> None:
        for stage in w.stages.values():
            stage.invalidate()  # another worker may update these keys before we see them again

    @app.on_partitions_assigned.connect
    async def on_assigned(app, assigned, **kwargs) -> None:
        for stage in w.stages.values():
            stage.invalidate()
        for topic in inputs:
            metrics.ASSIGNED_PARTITIONS.labels(topic).set(sum(tp.topic == topic for tp in assigned))

    @app.task
    async def start_outbox() -> None:
        outbox.after_delivery.append(kafka_compat.wake_fetcher)  # our own next stage may be waiting for these
        outbox.start(asyncio.get_running_loop())

    @app.timer(5.0)
    async def report_lag():
        consumer = app.consumer
        for tp in consumer.assignment():
            committed = consumer._committed_offset.get(tp)  # faust keeps no public accessor for this
            try:
                highwater = consumer.highwater(tp)
            except Exception:  # noqa: BLE001 - partition not fetched yet
                continue
            if highwater is not None and committed is not None:
                metrics.CONSUMER_LAG.labels(tp.topic, str(tp.partition)).set(max(0, highwater - committed))

    return w


def _count_writes(writes: dict[str, int]) -> None:
    for table, n in writes.items():
        if n:
            metrics.STATE_WRITES.labels(table).inc(n)
