"""The faust agents: thin wiring between topics and the plain logic in `stages.py` and `decisions.py`.

ingest            posts -> decode + validate -> the post's stages | posts.dlq
features-<stage>  bundles of items from other workers (and from this one when hops go through
                  Kafka) -> `Stage.apply` (user; link = url + domain; ip; post) -> the next stages
ingest-<kind>     reports, engagements, labels, bans -> decode + validate -> the stages of the tables
                  they update | posts.dlq (every worker also reads the ban log itself: bans.py)
awaiting-text     posts decided during a text-model outage -> decided again with it (revision + 1)
the post stage    hands ready posts to the `DecisionBatcher` -> Triton -> decisions, and the verdict
                  back to the tables through features.post (and features.user / features.ip)

Where an item goes next: a stage's tables live on the partition of the item's key. When this worker
owns that partition of the stage topic, the item is applied here and now, in the same round (no Kafka
hop: what Kafka would have done is deliver it to us); otherwise it joins the round's bundle for that
partition (streams/bundles.py) and whichever worker owns it applies it. MODPIPE_LOCAL_HOPS=off sends
every hop through Kafka. Either way a table is only ever written by the owner of its partition, under
that partition (`PartitionEvent`), and one worker's view of its partitions is cleared at every
rebalance.

Every agent takes what is ready (`take_ready`) as one `Round`: it applies the round's events, writes
each changed table state once, and publishes one bundle record per destination partition through the
outbox, all without awaiting anything. The round's input events are acked (so committed) only when
everything they produced is delivered: bundles, changelog records, dead letters, and for posts their
decisions (`outbox.Pending`). A worker killed at any point loses nothing; what it had not committed is
processed again, and the states ignore events they have already counted.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field

import orjson
from faust.types import TP

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
from streams.stages import ReadyPost, Redecision, Stage, event_items, post_item
from streams.table_states import ChangelogWriter
from streams.take import take_ready

_log = log.get(__name__)

REVOKE_DRAIN_S = 10.0  # at most this long (below the rebalance timeout) for our records to be delivered
ROUND_MAX = 128  # records handled per round at most (a stage record is a bundle of many items)
DECODERS = {"report": schema.decode_report, "engagement": schema.decode_engagement, "label": schema.decode_label,
            "ban": schema.decode_ban}


class PartitionEvent:
    """Stands in for a record of a stage topic's partition when an item is applied without the Kafka hop:
    faust's table store and our changelog writer take the partition from the current event."""

    class _Message:
        __slots__ = ("topic", "partition", "offset", "key", "tp")

        def __init__(self, topic: str, partition: int):
            self.topic, self.partition, self.offset, self.key = topic, partition, -1, None
            self.tp = TP(topic, partition)

    def __init__(self, topic: str, partition: int):
        self.message = self._Message(topic, partition)


@dataclass
class Round:
    """What one round of an agent produced, and the events it holds until that is delivered."""
    pending: Pending
    bundler: Bundler
    events: list = field(default_factory=list)
    ready: list[ReadyPost] = field(default_factory=list)
    redecisions: list[Redecision] = field(default_factory=list)


class Wiring:
    """What the agents share: the stages' tables, the outbox, the decision batcher, the partitions owned."""

    def __init__(self, pipe: Pipeline, settings: Settings, scorer: TextScorer, decider: Decider,
                 bans: BanRegistry, outbox: Outbox, shadow=None):
        self.pipe, self.settings, self.decider, self.outbox = pipe, settings, decider, outbox
        self.topics = pipe.topics
        self.partitions = pipe.partitions
        self.local_hops = settings.local_hops == "on"
        writers = {name: ChangelogWriter(table, outbox) for name, table in pipe.tables.items()}
        outbox.after_delivery += [writer.persist_offsets for writer in writers.values()]
        cached_keys = {t: settings.post_state_cache_keys if t == fe.POST else settings.state_cache_keys
                       for t in fe.TABLES}
        self.stages = {name: Stage(name, pipe.tables, DEFAULT_LIMITS, is_banned=bans.is_banned,
                                   redecide_reports=settings.redecide_reports, writers=writers,
                                   cached_keys=cached_keys)
                       for name in fe.STAGES}
        text_version = "off" if scorer.disabled else scorer.model_version
        # read per batch: a promoted decision model changes the decider's version without a restart
        self.publisher = Publisher(outbox, pipe.topics, lambda: {"text_model": text_version, "decider": decider.version})
        self.batcher = DecisionBatcher(scorer, decider, self.publisher, max_batch=settings.max_batch,
                                       max_wait_s=settings.max_wait_ms / 1000, max_inflight=settings.max_inflight,
                                       on_error=self.crash, feedback=self.feedback, shadow=shadow)
        self.owned: set[TP] = set()  # stage-topic partitions assigned to this worker (empty while rebalancing)
        self.assignments = 0  # assignments received (readiness: the worker has been given its partitions)
        self._partition_events: dict[tuple[str, int], PartitionEvent] = {}
        self.flush_interval_s = settings.state_flush_ms / 1000
        self._awaiting_flush: list[Pending] = []  # rounds whose state changes are not written yet
        self._flush_timer: asyncio.TimerHandle | None = None

    def crash(self, exc: Exception) -> None:
        """Stop the worker: what is not acked is processed again after the restart (at-least-once)."""
        asyncio.ensure_future(self.pipe.app.crash(exc))

    def new_round(self, stream=None, events=()) -> Round:
        return Round(Pending(stream, events, on_error=self.crash), Bundler(self.partitions), list(events))

    def dead_letter(self, event, error: Exception, pending: Pending, raw: bytes | None = None) -> None:
        send_dead_letter(self.outbox, self.topics.dead_letters, event, error, pending, raw)

    def decoded(self, r: Round, decode):
        """(event, decode(event)) for each event of the round; an event that does not decode goes to the
        dead letters with its reason (one bad record must not stall its partition)."""
        for event in r.events:
            try:
                value = decode(event)
            except schema.InvalidMessage as exc:
                self.dead_letter(event, exc, r.pending)
                continue
            except Exception as exc:  # noqa: BLE001 - a bug or a foreign record: logged, dead-lettered
                _log.exception("record could not be decoded", extra={"topic": event.message.topic})
                self.dead_letter(event, exc, r.pending)
                continue
            yield event, value

    def dispatch(self, r: Round, items, origin) -> None:
        """Send items to their stages: applied here when this worker owns the partition (and what they
        produce in turn), else bundled for the owner. `origin` is the input record they stem from."""
        queue = collections.deque(items)
        while queue:
            stage, pkey, item = queue.popleft()
            topic = self.topics.stages[stage]
            partition = partition_for(pkey, self.partitions)
            if not (self.local_hops and TP(topic, partition) in self.owned):
                r.bundler.add(topic, pkey, item)
                continue
            event = self._partition_events.get((topic, partition))
            if event is None:
                event = self._partition_events[(topic, partition)] = PartitionEvent(topic, partition)
            try:
                out = self.stages[stage].apply(item, event)
            except Exception as exc:  # noqa: BLE001 - one bad item must not stall the round
                _log.exception("feature stage failed on an item", extra={"stage": stage})
                self.dead_letter(origin, exc, r.pending, raw=orjson.dumps(item))
                continue
            metrics.LOCAL_HOPS.labels(stage).inc()
            queue.extend(out.items)
            r.ready += out.ready
            r.redecisions += out.redecisions

    def finish(self, r: Round) -> None:
        """End of a round: re-decisions, state changes to the next checkpoint, ready posts to the batcher,
        bundles out."""
        while r.redecisions:  # a re-decision's feedback can reach the post table here and now
            redecisions, r.redecisions = r.redecisions, []
            items = self.publisher.redecide(self.decider, redecisions, r.pending)
            self.dispatch(r, items, origin=r.events[0])
        self._await_flush(r.pending)
        for post in r.ready:  # each holds the round's events until its decision is delivered
            post.source = r.pending
        r.pending.hold(len(r.ready))
        self.batcher.submit(r.ready)
        self.publisher.send_bundles(r.bundler, r.pending)
        r.pending.seal()

    def _await_flush(self, pending: Pending) -> None:
        """The round's table changes are written at the next checkpoint; its events wait for that too."""
        pending.hold()
        self._awaiting_flush.append(pending)
        if self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(self.flush_interval_s, self.flush_states)

    def flush_states(self) -> None:
        """Checkpoint: each state changed since the last one written once, its changelog record holding
        the rounds that changed it (Kafka Streams' record cache and Quix Streams' checkpoints do the same:
        a hot key costs one record per checkpoint, not one per round). Runs every MODPIPE_STATE_FLUSH_MS
        and before partitions are given up."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if not self._awaiting_flush:
            return
        rounds, self._awaiting_flush = self._awaiting_flush, []
        checkpoint = Pending(on_error=self.crash, on_done=lambda: [p.release() for p in rounds])
        for stage in self.stages.values():
            for table, n in stage.flush(checkpoint).items():
                if n:
                    metrics.STATE_WRITES.labels(table).inc(n)
        checkpoint.seal()

    def feedback(self, items, pending: Pending) -> None:
        """A batch's verdicts back to the tables: through the stage topics. (Not applied here even when this
        worker owns the partition: the decision is already out, and the worker may be recovering a table
        partition it was just given while Triton answered.)"""
        bundler = Bundler(self.partitions)
        for stage, pkey, item in items:
            bundler.add(self.topics.stages[stage], pkey, item)
        self.publisher.send_bundles(bundler, pending)

    def assigned(self, assigned) -> None:
        stage_topics = set(self.topics.stages.values())
        self.owned = {tp for tp in assigned if tp.topic in stage_topics}
        self.assignments += 1
        self.invalidate()

    def revoked(self) -> None:
        self.flush_states()  # while the partitions are still ours
        self.owned = set()
        self.invalidate()

    def invalidate(self) -> None:
        for stage in self.stages.values():
            stage.invalidate()  # another worker may update these keys before we see them again


def attach_agents(pipe: Pipeline, settings: Settings, scorer: TextScorer, decider: Decider, bans: BanRegistry,
                  outbox: Outbox, shadow=None) -> Wiring:
    """`shadow`: a modpipe.decision.live.ShadowScorer scoring every first decision beside the decider."""
    app = pipe.app
    w = Wiring(pipe, settings, scorer, decider, bans, outbox, shadow)
    outbox.on_fatal = w.crash

    @app.agent(pipe.posts, name="ingest")
    async def ingest(stream):
        async for events in take_ready(stream, ROUND_MAX):
            r = w.new_round(stream, events)
            metrics.POSTS_CONSUMED.inc(len(events))
            for event, first_hop in w.decoded(r, first_hop_of):
                w.dispatch(r, [first_hop], origin=event)
            w.finish(r)

    def first_hop_of(event):
        post = schema.decode_post(event.value, settings.max_text_chars)
        return post_item(post, event_timestamp_ms(event))

    def make_stage_agent(name: str):
        stage = w.stages[name]

        async def stage_agent(stream):
            async for events in take_ready(stream, ROUND_MAX):
                r = w.new_round(stream, events)
                for event, items in w.decoded(r, lambda event: decode_bundle(event.value)):
                    # The bundle's partition is this worker's (faust assigned it), so its items apply here.
                    for item in items:
                        try:
                            out = stage.apply(item, event)
                        except Exception as exc:  # noqa: BLE001 - one bad item must not stall the partition
                            _log.exception("feature stage failed on an item", extra={"stage": name})
                            w.dead_letter(event, exc, r.pending, raw=orjson.dumps(item))
                            continue
                        r.ready += out.ready
                        r.redecisions += out.redecisions
                        w.dispatch(r, out.items, origin=event)
                w.finish(r)

        stage_agent.__name__ = f"features_{name}"
        return stage_agent

    for name, topic in pipe.stages.items():
        app.agent(topic, name=f"features-{name}")(make_stage_agent(name))

    def make_side_input(kind: str):
        decode = DECODERS[kind]

        async def side_input(stream):
            async for events in take_ready(stream, ROUND_MAX):
                r = w.new_round(stream, events)
                for event, raw in w.decoded(r, lambda event: decode(event.value)):
                    metrics.EVENTS_CONSUMED.labels(kind).inc()
                    if kind == "ban":
                        # Every worker's BanRegistry applies it to new posts; the domain table finds the
                        # posts decided before it, so they are decided again.
                        _log.info("ban received", extra={"kind": raw["kind"], "value": raw["value"],
                                                         "action": raw["action"]})
                    w.dispatch(r, event_items(kind, fe.PREPARE[kind](raw)), origin=event)
                w.finish(r)

        side_input.__name__ = f"ingest_{kind}"
        return side_input

    for kind, topic in {**pipe.side_inputs, "ban": pipe.bans}.items():
        app.agent(topic, name=f"ingest-{kind}")(make_side_input(kind))

    @app.agent(pipe.awaiting_text, name="awaiting-text")
    async def awaiting_text(stream):
        # Waits for Triton for as long as it takes: these posts have a (degraded) decision already.
        async for events in take_ready(stream, settings.max_batch):
            r = w.new_round(stream, events)
            records = [record for _, record in w.decoded(r, lambda event: orjson.loads(event.value))]
            if records:
                w.feedback(await w.publisher.decide_awaiting_text(scorer, decider, records, r.pending), r.pending)
            r.pending.seal()

    inputs = set(pipe.topics.inputs())

    @app.on_partitions_revoked.connect
    async def on_revoked(app, revoked, **kwargs) -> None:
        w.revoked()
        # faust awaits this before the group moves the partitions: the last checkpoint's changelog records
        # reach the broker before a new owner restores from the changelog and writes its own.
        await outbox.drain(REVOKE_DRAIN_S)

    @app.on_partitions_assigned.connect
    async def on_assigned(app, assigned, **kwargs) -> None:
        w.assigned(assigned)
        for topic in inputs:
            metrics.ASSIGNED_PARTITIONS.labels(topic).set(sum(tp.topic == topic for tp in assigned))

    # Posts beyond the next Triton batch are waiting anyway: fetching faster would not decide them sooner.
    kafka_compat.set_backlog_check(lambda: w.batcher.queued >= settings.max_batch)

    @app.task
    async def start_outbox() -> None:
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
