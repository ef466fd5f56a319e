"""The handlers of the input topics: thin wiring between topics and the plain logic in `stages.py` and
`decisions.py`. The runner (streams/runtime/runner.py) calls them with the records of one round.

ingest            posts -> decode + validate -> the post's stages | posts.dlq
features-<stage>  bundles of items from other workers (and from this one when hops go through
                  Kafka) -> `Stage.apply` (user; link = url + domain; ip; post) -> the next stages
ingest-<kind>     reports, engagements, labels, bans -> decode + validate -> the stages of the tables
                  they update | posts.dlq (every worker also reads the ban log itself: bans.py)
awaiting-text     posts decided during a text-model outage -> decided again with it (revision + 1)
the post stage    hands ready posts to the `DecisionBatcher` -> Triton -> decisions, and the verdict
                  back to the post table (and user / ip): in place while its epoch is open, else through
                  the stage topics (`Wiring.feedback`)

Where an item goes next: a stage's tables live on the partition of the item's key. When this worker
owns that partition of the stage topic, the item is applied here and now, in the same round (no Kafka
hop: what Kafka would have done is deliver it to us); otherwise it joins the round's bundle for that
partition (streams/moderation/bundles.py) and whichever worker owns it applies it. MODPIPE_LOCAL_HOPS=off sends
every hop through Kafka. Either way a table is only ever written by the owner of its partition, under
that partition (`PartitionEvent`), and one worker's view of its partitions is cleared at every
rebalance.

Each handler gets a `Round`: the records one fetch brought for its topic (at most ROUND_MAX). It applies
them, writes nothing to the tables yet (changed states are written once per key at the checkpoint) and
produces one bundle record per destination partition into the open transaction, all without awaiting
anything. A round is complete when everything it produced is delivered and, for posts, their decisions are
published (`outbox.Pending`); the checkpoint (streams/checkpointing/checkpoint.py) waits for every round to be complete
before it commits their input offsets together with their outputs.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson
from modpipe.features import events as fe
from modpipe.features.state import DEFAULT_LIMITS
from modpipe.streams import metrics
from modpipe.streams.checkpointing.checkpoint import Epochs
from modpipe.streams.checkpointing.outbox import Outbox, Pending
from modpipe.streams.kafka.records import TP
from modpipe.streams.moderation.app import Pipeline
from modpipe.streams.moderation.bans import BanRegistry
from modpipe.streams.moderation.bundles import Bundler, decode_bundle, partition_for
from modpipe.streams.moderation.carried import CarriedPosts
from modpipe.streams.moderation.dead_letters import event_timestamp_ms, send_dead_letter
from modpipe.streams.moderation.decisions import DecisionBatcher, Publisher
from modpipe.streams.moderation.scoring import TextModelUnavailable, TextScorer
from modpipe.streams.moderation.stages import ReadyPost, Redecision, Stage, event_items, post_item
from modpipe.streams.state.ends import ChangelogEnds
from modpipe.streams.state.table_states import ChangelogWriter

from modpipe import log, memory, schema
from modpipe.decision.verdict import Decider
from modpipe.settings import Settings

_log = log.get(__name__)

ROUND_MAX = 128  # records handled per round at most (a stage record is a bundle of many items)
DECODERS = {"report": schema.decode_report, "engagement": schema.decode_engagement, "label": schema.decode_label,
            "ban": schema.decode_ban}


class PartitionEvent:
    """Stands in for a record of a stage topic's partition when an item is applied without the Kafka hop:
    the table states take the partition from the event in hand."""

    __slots__ = ("topic", "partition", "offset", "key", "value", "timestamp_ms", "tp")

    def __init__(self, topic: str, partition: int):
        self.topic, self.partition, self.offset, self.key, self.value, self.timestamp_ms = \
            topic, partition, -1, None, None, None
        self.tp = TP(topic, partition)

    @property
    def message(self) -> PartitionEvent:
        return self


@dataclass
class Round:
    """What one round produced, and what it waits for before it is complete."""
    pending: Pending
    bundler: Bundler
    events: list = field(default_factory=list)
    ready: list[ReadyPost] = field(default_factory=list)
    redecisions: list[Redecision] = field(default_factory=list)
    # counted as items are applied, added to the metrics once at the round's end (`Wiring.finish`)
    local_hops: collections.Counter = field(default_factory=collections.Counter)  # stage -> items
    resent: int = 0
    checked: int = 0


class Wiring:
    """What the agents share: the stages' tables, the outbox, the decision batcher, the partitions owned."""

    def __init__(self, pipe: Pipeline, settings: Settings, scorer: TextScorer, decider: Decider,
                 bans: BanRegistry, outbox: Outbox, shadow=None):
        self.pipe, self.settings, self.decider, self.outbox = pipe, settings, decider, outbox
        self.topics = pipe.topics
        self.partitions = pipe.partitions
        self.local_hops = settings.local_hops == "on"
        # where each table partition's changelog ends, committed with its stage partition's offset
        self.changelog_ends = ChangelogEnds()
        writers = {name: ChangelogWriter(table, outbox, self.changelog_ends) for name, table in pipe.tables.items()}
        cached_keys = {t: settings.post_state_cache_keys if t == fe.POST else settings.state_cache_keys
                       for t in fe.TABLES}
        self.budgets = memory.apply_budget(settings.worker_memory_mb)
        self.stages = {name: Stage(name, pipe.tables, DEFAULT_LIMITS, is_banned=bans.is_banned,
                                   redecide_reports=settings.redecide_reports, writers=writers,
                                   cached_keys=cached_keys,
                                   cache_bytes=self.budgets["state_cache"] // len(fe.TABLES))
                       for name in fe.STAGES}
        # the decoded states of the open checkpoint, and the records held back for the next transaction while a
        # checkpoint commits, are bounded by starting no round above their shares until a checkpoint has written
        # the states or committed (`checkpoint_full`, `checkpoint_room`)
        self.states_max_bytes = self.budgets["checkpoint_states"]
        self.next_epoch_max_bytes = self.budgets["next_epoch"]
        self._checkpoint_room = asyncio.Event()
        self._checkpoint_room.set()
        text_version = "off" if scorer.disabled else scorer.model_version
        # read per batch: a promoted decision model changes the decider's version without a restart
        self.publisher = Publisher(outbox, pipe.topics, lambda: {"text_model": text_version, "decider": decider.version})
        # posts still waiting for the text model when their checkpoint commits: kept as state (carried.py)
        self.carried = CarriedPosts(pipe.awaiting_model, outbox, self.changelog_ends, pipe.partitions)
        self.on_round = lambda: None  # set by the runner: a round was opened (a checkpoint is due)
        self.batcher = DecisionBatcher(scorer, decider, self.publisher, max_batch=settings.max_batch,
                                       max_wait_s=settings.max_wait_ms / 1000, max_inflight=settings.max_inflight,
                                       on_error=self.crash, feedback=self.feedback, shadow=shadow,
                                       max_bytes=self.budgets["decision_queue"], open_round=self._carried_round,
                                       carried_decided=self.carried.decided)
        # per (stage, partition): the stand-in record its items are applied under here, or None when they go
        # through Kafka (a partition of another worker, or MODPIPE_LOCAL_HOPS=off); rebuilt when `owned` changes
        self._local: dict[tuple[str, int], PartitionEvent | None] = {}
        self.owned: set[TP] = set()  # stage-topic partitions assigned to this worker (empty while rebalancing)
        self.assignments = 0  # assignments received (readiness: the worker has been given its partitions)
        self._partition_events: dict[tuple[str, int], PartitionEvent] = {}
        self.epochs = Epochs()  # rounds (and checkpoint writes) not complete yet, per checkpoint epoch
        self.on_crash = lambda exc: None  # set by the worker: stop it (exit non-zero) without committing

    @property
    def owned(self) -> set[TP]:
        return self._owned

    @owned.setter
    def owned(self, tps: set[TP]) -> None:
        self._owned = tps
        self._local.clear()

    def _stand_in(self, stage: str, partition: int) -> PartitionEvent | None:
        topic = self.topics.stages[stage]
        if not (self.local_hops and TP(topic, partition) in self._owned):
            return None
        event = self._partition_events.get((topic, partition))
        if event is None:
            event = self._partition_events[(topic, partition)] = PartitionEvent(topic, partition)
        return event

    def crash(self, exc: Exception) -> None:
        """Stop the worker: nothing of the open transaction is committed; its input is processed again by
        whoever owns the partitions next (this worker after its restart)."""
        self.on_crash(exc)

    @property
    def open_epoch(self) -> int:
        return self.epochs.open_epoch

    @property
    def open_rounds(self) -> int:
        return self.epochs.open_rounds

    def switch(self) -> int:
        return self.epochs.switch()

    def _opened(self, epoch: int | None = None, what: str = "round") -> Pending:
        return self.epochs.opened(self.crash, epoch, what)

    async def idle(self, epoch: int | None = None) -> None:
        """Until every round of `epoch` (default: of every epoch) opened so far is complete (its outputs
        delivered, its posts decided)."""
        await self.epochs.idle(epoch)

    def _carried_round(self) -> Pending:
        """The decisions of carried posts made now: a round of the open epoch, like a batch of input."""
        pending = self._opened(what="carried decisions")
        self.on_round()
        return pending

    def carry(self, epoch: int) -> int:
        """Checkpoint step 3: `epoch`'s posts whose decision is not made yet are written as state into its
        transaction, and their rounds complete without them. Returns how many."""
        posts = self.batcher.undecided(epoch)
        pending = self._opened(epoch, "carried posts")
        self.batcher.carry(posts, lambda post: self.carried.carry(post, pending))
        pending.seal()
        return len(posts)

    def decide_restored(self, partitions) -> int:
        """After a restore: the posts the restored post-stage `partitions` carried, to this worker's batcher."""
        posts = self.carried.restored(partitions)
        self.batcher.submit(posts)
        if posts:
            _log.info("carried posts restored; deciding them", extra={"posts": len(posts)})
        return len(posts)

    def new_round(self, events=()) -> Round:
        pending = self._opened(what=f"round of {events[0].message.topic}" if events else "round")
        return Round(pending, self.bundler(pending), list(events))

    def bundler(self, pending: Pending) -> Bundler:
        """A bundler whose records go out under `pending`, as soon as it holds more than its byte share."""
        return Bundler(self.partitions, self.budgets["bundles"],
                       on_full=lambda full: self.publisher.send_bundles(full, pending))

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
        produce in turn), else bundled for the owner. `origin` is the input record they stem from (None: a
        verdict's feedback, dead-lettered under the stage partition it was applied to)."""
        queue = collections.deque(items)
        local = self._local
        while queue:
            stage, pkey, item = queue.popleft()
            where = (stage, partition_for(pkey, self.partitions))
            event = local.get(where, False)
            if event is False:
                event = local[where] = self._stand_in(*where)
            if event is None:
                r.bundler.add(self.topics.stages[stage], pkey, item)
                continue
            try:
                out = self.stages[stage].apply(item, event)
            except Exception as exc:  # noqa: BLE001 - one bad item must not stall the round
                _log.exception("feature stage failed on an item", extra={"stage": stage})
                self.dead_letter(origin or event, exc, r.pending, raw=orjson.dumps(item))
                continue
            r.local_hops[stage] += 1
            queue.extend(out.items)
            r.ready += out.ready
            r.resent += out.resent
            r.checked += out.checked
            r.redecisions += out.redecisions

    def finish(self, r: Round) -> None:
        """End of a round: re-decisions, state changes to the next checkpoint, ready posts to the batcher,
        bundles out."""
        self._redecide(r)
        for post in r.ready:  # each holds the round's events until its decision is delivered
            post.source = r.pending
        r.pending.hold(len(r.ready))
        self.batcher.submit(r.ready)
        self.publisher.send_bundles(r.bundler, r.pending)
        r.pending.seal()
        self._count_hops(r)

    def _redecide(self, r: Round) -> None:
        while r.redecisions:  # a re-decision's feedback can reach the post table here and now
            redecisions, r.redecisions = r.redecisions, []
            items = self.publisher.redecide(self.decider, redecisions, r.pending)
            self.dispatch(r, items, origin=r.events[0] if r.events else None)

    @staticmethod
    def _count_hops(r: Round) -> None:
        for stage, n in r.local_hops.items():
            metrics.LOCAL_HOPS.labels(stage).inc(n)
        if r.resent:
            metrics.POSTS_RESENT.inc(r.resent)
        if r.checked:
            metrics.POSTS_CHECKED.inc(r.checked)

    def flush_states(self, epoch: int | None = None) -> Pending:
        """Each state changed since the last checkpoint written once, its changelog record in `epoch`'s
        transaction (Kafka Streams' record cache and Quix Streams' checkpoints do the same: a hot key costs
        one record per checkpoint, not one per round). Called as the epoch closes: the tables hold exactly its
        rounds' changes then (a round changes them synchronously as it starts; verdicts come back through the
        stage topics). The returned group completes when they are delivered."""
        pending = self._opened(epoch, "table states")
        for stage in self.stages.values():
            for table, n in stage.flush(pending).items():
                if n:
                    metrics.STATE_WRITES.labels(table).inc(n)
            # after the writes: a key written in this checkpoint is young, whatever its table's retention
            for table, n in stage.expire(pending).items():
                if n:
                    metrics.STATE_EXPIRED.labels(table).inc(n)
        pending.seal()
        self._checkpoint_room.set()
        self.observe_tables()
        return pending

    @property
    def checkpoint_full(self) -> str | None:
        """What holds more than its share of memory until a checkpoint: `states` (the decoded states used since
        the last checkpoint) or `next_epoch` (records held back while a checkpoint commits); None: nothing."""
        if sum(stage.batch_bytes for stage in self.stages.values()) > self.states_max_bytes:
            return "states"
        if self.outbox.later_bytes > self.next_epoch_max_bytes:
            return "next_epoch"
        return None

    async def checkpoint_room(self) -> None:
        """Until a checkpoint has written the states used since the last one, or committed (the records held
        back go out): the caller checks `checkpoint_full` again."""
        reason = self.checkpoint_full
        if reason is None:
            return
        self._checkpoint_room.clear()
        metrics.CHECKPOINT_WAITS.labels(reason).inc()
        await self._checkpoint_room.wait()

    def committed(self) -> None:
        """The checkpoint's transaction committed: the tables' stores take its states."""
        for table in self.pipe.tables.values():
            table.committed()
        self.changelog_ends.commit()
        self._checkpoint_room.set()  # the outbox sends the held-back records next (`Outbox.advance`)
        self.observe_tables()  # a RocksDB table counts its keys once they are in its stores

    def expiry_due(self) -> bool:
        """Whether a table holds keys past its retention (a quiet worker checkpoints to forget them)."""
        return any(table.expiry_due() for table in self.pipe.tables.values())

    def observe_tables(self) -> None:
        for name, table in self.pipe.tables.items():
            metrics.TABLE_KEYS.labels(name).set(table.keys())
            metrics.TABLE_BYTES.labels(name).set(table.size_bytes)

    def feedback(self, items, pending: Pending) -> None:
        """A batch's verdicts back to the tables. Applied here and now when their epoch is still the open one
        (its states are not written yet, so the tables' change goes into the same transaction as the decision)
        and this worker owns the partition; otherwise through the stage topics, in a later transaction that
        holds the bundle's offsets. (A partition changes hands only after every epoch is committed, at the
        revocation: an open epoch's posts were applied to partitions this worker still owns.)"""
        r = Round(pending, self.bundler(pending))
        if self.local_hops and pending.epoch is not None and pending.epoch == self.open_epoch:
            self.dispatch(r, items, origin=None)
            self._redecide(r)
        else:
            for stage, pkey, item in items:
                r.bundler.add(self.topics.stages[stage], pkey, item)
        self.publisher.send_bundles(r.bundler, pending)
        self._count_hops(r)

    def assigned(self, assigned) -> None:
        stage_topics = set(self.topics.stages.values())
        self.owned = {tp for tp in assigned if tp.topic in stage_topics}
        self.assignments += 1
        self.invalidate()
        self.observe_tables()

    def revoked(self, partitions=None) -> int:
        """Partitions taken away (every checkpoint committed): their carried posts are their next owner's to
        decide. Returns how many posts this worker dropped."""
        self.owned = set()
        self.invalidate()
        gone = None if partitions is None else set(partitions)
        return self.batcher.drop(lambda post: gone is None or self.carried.partition_of(post) in gone)

    def invalidate(self) -> None:
        for stage in self.stages.values():
            stage.invalidate()  # another worker may update these keys before we see them again


def make_handlers(w: Wiring, settings: Settings, scorer: TextScorer, decider: Decider) -> dict:
    """Input topic -> its handler. A handler takes one round's records (one topic, in offset order per
    partition). Every handler is synchronous except the awaiting-text one, a coroutine function of
    (records, done) that calls `done()` as it publishes their decisions and returns False when the text model is
    still unavailable (the records are then read again later)."""
    topics = w.topics

    def first_hop_of(event):
        post = schema.decode_post(event.value, settings.max_text_chars)
        return post_item(post, event_timestamp_ms(event))

    def ingest(events) -> None:
        r = w.new_round(events)
        metrics.POSTS_CONSUMED.inc(len(events))
        for event, first_hop in w.decoded(r, first_hop_of):
            w.dispatch(r, [first_hop], origin=event)
        w.finish(r)

    def make_stage_handler(name: str):
        stage = w.stages[name]

        def stage_handler(events) -> None:
            r = w.new_round(events)
            for event, items in w.decoded(r, lambda event: decode_bundle(event.value)):
                # The bundle's partition is this worker's (the group assigned it), so its items apply here.
                for item in items:
                    try:
                        out = stage.apply(item, event)
                    except Exception as exc:  # noqa: BLE001 - one bad item must not stall the partition
                        _log.exception("feature stage failed on an item", extra={"stage": name})
                        w.dead_letter(event, exc, r.pending, raw=orjson.dumps(item))
                        continue
                    r.ready += out.ready
                    r.resent += out.resent
                    r.checked += out.checked
                    r.redecisions += out.redecisions
                    w.dispatch(r, out.items, origin=event)
            w.finish(r)

        return stage_handler

    def make_side_input(kind: str):
        decode = DECODERS[kind]

        def side_input(events) -> None:
            r = w.new_round(events)
            for event, raw in w.decoded(r, lambda event: decode(event.value)):
                metrics.EVENTS_CONSUMED.labels(kind).inc()
                if kind == "ban":
                    # Every worker's BanRegistry applies it to new posts; the domain table finds the
                    # posts decided before it, so they are decided again.
                    _log.info("ban received", extra={"kind": raw["kind"], "value": raw["value"],
                                                     "action": raw["action"]})
                w.dispatch(r, event_items(kind, fe.PREPARE[kind](raw)), origin=event)
            w.finish(r)

        return side_input

    def awaiting_record(event) -> dict:
        record = orjson.loads(event.value)
        if not (isinstance(record, dict) and isinstance(record.get("post"), dict)
                and isinstance(record["post"].get("text"), str) and isinstance(record.get("features"), dict)):
            raise schema.InvalidMessage("not a post awaiting the text model (post.text, features)")
        return record

    async def awaiting_text(events, done: Callable[[], None], still_ours: Callable[[], bool] = lambda: True) -> bool:
        # These posts have a (degraded) decision already: while Triton stays unavailable they wait in their
        # topic, uncommitted, and are read again later. Each try is one request: the probe that ends the
        # outage when no new post asks Triton anything. Triton is asked before the round opens, so no checkpoint
        # (and no transaction) waits for it; the round then runs without an await, in the epoch open by then.
        texts = []
        for event in events:
            try:
                texts.append(awaiting_record(event)["post"]["text"])
            except (schema.InvalidMessage, orjson.JSONDecodeError):
                continue  # dead-lettered in the round below
        try:
            probabilities = await scorer.spam_probabilities(texts)
        except TextModelUnavailable:
            return False
        if not still_ours():  # their partitions were revoked while Triton answered: their next owner decides them
            return True
        r = w.new_round(events)
        records = [record for _, record in w.decoded(r, awaiting_record)]
        if records:
            w.feedback(w.publisher.decide_awaiting_text(decider, records, probabilities, r.pending), r.pending)
        done()  # no await since the round opened: the next checkpoint holds its decisions and its offsets
        r.pending.seal()
        return True

    handlers = {topics.posts: ingest, topics.awaiting_text: awaiting_text}
    handlers.update({topic: make_stage_handler(name) for name, topic in topics.stages.items()})
    handlers.update({topic: make_side_input(kind) for kind, topic in
                     {"report": topics.reports, "engagement": topics.engagements, "label": topics.labels,
                      "ban": topics.bans}.items()})
    return handlers
