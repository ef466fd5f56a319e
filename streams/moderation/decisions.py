"""From a post with its features to a published decision: Triton batches, the decider, the feedback.

`DecisionBatcher` takes ready posts from the post stage and keeps up to MODPIPE_MAX_INFLIGHT Triton
requests going: a post is sent as soon as a slot is free (no timer at low load); while every slot is
taken, posts gather into the next batch (up to MODPIPE_MAX_BATCH), and a batch that finds a slot while
another request is still at Triton waits up to MODPIPE_MAX_WAIT_MS to fill. Bans short-circuit before
the text model; repeats come from the text cache (`scoring.TextCache`). The queue is bounded by count and by
bytes (its share of MODPIPE_WORKER_MEMORY_MB): past either, the runner pauses fetching, and past the bytes it
starts no round until Triton has taken posts off (`room`); a post handed over is never refused, so its round
completes as usual.

During a text-model outage (Triton failing for MODPIPE_TEXT_MODEL_OUTAGE_S) a batch is decided without it
as MODPIPE_TEXT_MODEL_OUTAGE_POLICY says (`decide` or `review`; `wait` keeps retrying): each such decision
is marked `degraded` and its post goes to `posts.awaiting-text`, where `Publisher.decide_awaiting_text`
decides it again with the text model (revision + 1) once Triton answers.

`Publisher.publish` is the one place a decision is published: the record to `decisions` (key post_id);
it returns the verdict's feedback items for the tables (stages.decision_items), which the wiring sends
on. A post's source (`Pending`) is released only when its decision and feedback are delivered: its round is
complete only then, and the checkpoint commits its offsets with them.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Sequence

from modpipe.features.vector import features_size
from modpipe.streams import metrics
from modpipe.streams.checkpointing.outbox import Outbox, Pending
from modpipe.streams.moderation.bundles import Bundler
from modpipe.streams.moderation.scoring import TextModelUnavailable, TextScorer
from modpipe.streams.moderation.stages import ReadyPost, Redecision, decision_items
from modpipe.streams.moderation.topics import TopicNames
from modpipe.streams.waiting import wait_at_most

from modpipe import log, memory, schema
from modpipe.decision.engine import cascade, shortcut
from modpipe.decision.verdict import Decider, without_text_model

_log = log.get(__name__)


def features_for(features: dict, text_probability: float | None) -> dict:
    """The feature map of the decision: the feature stages' map plus the text model's probability."""
    return {**features, "text_probability": None if text_probability is None else round(float(text_probability), 6)}


class Publisher:
    """Publishes decisions and bundles through the outbox."""

    def __init__(self, outbox: Outbox, topics: TopicNames, model_versions: dict | Callable[[], dict]):
        self.outbox, self.topics = outbox, topics
        self._versions = model_versions if callable(model_versions) else (lambda: model_versions)
        # a labelled child looked up once, not per decision (`labels()` takes a lock and builds its key)
        self._decisions = {v: metrics.DECISIONS.labels(v) for v in schema.VERDICTS}

    @property
    def model_versions(self) -> dict:
        """The models a decision is made with now (the decider's changes when a model is promoted)."""
        return self._versions()

    def record(self, post: dict, verdict, features: dict, received_at_ms: int, decided_at_ms: int, *,
               revision: int = 1, degraded: bool = False, versions: dict | None = None) -> dict:
        """The decision record of a verdict (`versions`: the models it was made with; default: now)."""
        return schema.decision(
            post=post, verdict=verdict.verdict, spam_probability=verdict.spam_probability,
            text_probability=features.get("text_probability"), reasons=verdict.reasons, features=features,
            short_circuit=verdict.short_circuit, model_versions=versions or self.model_versions,
            received_at_ms=received_at_ms, decided_at_ms=decided_at_ms, revision=revision, degraded=degraded)

    def publish(self, record: dict, ctx: dict, received_at_ms: int, pending: Pending) -> list:
        """Produce the decision; returns its feedback items (stage, partition key, item) for the tables."""
        snapshot = {"post": {"post_id": record["post_id"], "user_id": record["user_id"]},
                    "received_at_ms": received_at_ms, "features": record["features"], "revision": record["revision"],
                    "degraded": record["degraded"]}
        self.outbox.produce(self.topics.decisions, schema.dumps(record), key=record["post_id"].encode(),
                            pending=pending)
        self._decisions[record["verdict"]].inc()
        if record["short_circuit"]:
            metrics.SHORTCUTS.labels(record["short_circuit"]).inc()
        return decision_items(ctx, record["verdict"] == "block", record["revision"], snapshot)

    def await_text(self, post: ReadyPost, features: dict, revision: int, pending: Pending) -> None:
        """A post decided without the text model, kept (key post_id) to be decided again with it."""
        record = {"post": post.post, "ctx": post.ctx, "features": features, "received_at_ms": post.received_at_ms,
                  "revision": revision}
        self.outbox.produce(self.topics.awaiting_text, schema.dumps(record), key=post.post["post_id"].encode(),
                            pending=pending)

    def decide_awaiting_text(self, decider: Decider, records: Sequence[dict], probabilities,
                             pending: Pending) -> list:
        """Posts decided during an outage, decided again with the text model's `probabilities` (one per record;
        revision + 1). Returns the feedback items."""
        features_list = [features_for(r["features"], None if p != p else p)
                         for r, p in zip(records, probabilities, strict=True)]
        now = schema.now_ms()
        items = []
        for r, features, verdict in zip(records, features_list, cascade(decider, features_list), strict=True):
            record = self.record(r["post"], verdict, features, r["received_at_ms"], now, revision=r["revision"] + 1)
            items += self.publish(record, r["ctx"], r["received_at_ms"], pending)
            metrics.REDECISIONS.labels("text_model_back").inc()
        return items

    def send_bundles(self, bundler: Bundler, pending: Pending) -> None:
        for topic, partition, value, n in bundler.records():
            self.outbox.produce(topic, value, partition=partition, pending=pending)
            metrics.BUNDLE_ITEMS.observe(n)

    def redecide(self, decider: Decider, redecisions: Sequence[Redecision], pending: Pending) -> list:
        """Decide posts again from their stored snapshots (reports crossed the threshold, or a later ban);
        returns the feedback items."""
        verdicts = cascade(decider, [r.request["features"] for r in redecisions])
        now = schema.now_ms()
        items = []
        for r, verdict in zip(redecisions, verdicts, strict=True):
            request, features = r.request, r.request["features"]
            record = self.record(request["post"], verdict, features, request["received_at_ms"], now,
                                 revision=request["revision"])
            items += self.publish(record, r.ctx, request["received_at_ms"], pending)
            metrics.REDECISIONS.labels(request["reason"]).inc()
            _log.info("post decided again", extra={"post_id": r.post_id, "reason": request["reason"],
                                                   "revision": request["revision"], "verdict": verdict.verdict})
        return items


class DecisionBatcher:
    """Ready posts -> Triton batches -> verdicts -> decisions (see the module docstring)."""

    def __init__(self, scorer: TextScorer, decider: Decider, publisher: Publisher, *, max_batch: int,
                 max_wait_s: float, max_inflight: int, on_error: Callable[[Exception], None],
                 feedback: Callable[[list, Pending], None], shadow=None, max_bytes: int | None = None,
                 open_round: Callable[[], Pending] | None = None,
                 carried_decided: Callable[[ReadyPost, Pending], None] | None = None):
        self.scorer, self.decider, self.publisher = scorer, decider, publisher
        self.shadow = shadow  # modpipe.decision.live.ShadowScorer: compared, never published
        self.outage_policy = scorer.outage_policy
        self.feedback = feedback  # sends a batch's feedback items on (under the batch's Pending)
        self.max_batch, self.max_wait_s = max_batch, max_wait_s
        self.on_error = on_error
        self._queue: collections.deque[ReadyPost] = collections.deque()
        self._sizes: collections.deque[int] = collections.deque()  # bytes of each queued post, in step
        self.queued_bytes = 0
        self._queue_bytes = metrics.BUFFER_BYTES.labels("decision_queue")  # looked up once: set every round
        self._room = asyncio.Event()  # set whenever the queue is no longer `full`
        self.max_bytes = memory.budget_bytes("decision_queue", memory.DEFAULT_WORKER_MEMORY_MB) \
            if max_bytes is None else max_bytes
        # two rounds of full batches for every slot: Triton never waits for posts, and a post waits for at most
        # that many batches (its epoch is then still open when its verdict comes back, wiring.feedback)
        self.max_queued = max_batch * max_inflight * 2
        self._ready = asyncio.Event()
        self._more = asyncio.Event()
        self._slots = asyncio.Semaphore(max_inflight)
        self._inflight = 0
        self._runner: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._at_triton: dict[asyncio.Task, list[ReadyPost]] = {}  # batches in flight, by their task
        # Carried posts (streams/moderation/carried.py) belong to no epoch while they wait: their decision opens a
        # round of the epoch open when it is made (`open_round`), which also takes the tombstone of their record
        # (`carried_decided`).
        self.open_round = open_round or (lambda: Pending(on_error=self.on_error))
        self.carried_decided = carried_decided or (lambda post, pending: None)

    def undecided(self, epoch: int) -> list[ReadyPost]:
        """The posts of `epoch`'s rounds whose decision is not made yet: queued, or in a batch at Triton. (A
        decision is made and produced in one step after Triton answers, so no post is half way.)"""
        posts = [p for p in self._queue if not p.carried and p.source is not None and p.source.epoch == epoch]
        for batch in self._at_triton.values():
            posts += [p for p in batch
                      if not p.carried and not p.dropped and p.source is not None and p.source.epoch == epoch]
        return posts

    def carry(self, posts: Sequence[ReadyPost], keep: Callable[[ReadyPost], None]) -> None:
        """`keep(post)` writes each post as state into the checkpoint's transaction; then its round no longer
        waits for its decision (which opens a round of its own when it is made)."""
        for post in posts:
            keep(post)
            source, post.source = post.source, None
            source.release()
        if posts:
            metrics.POSTS_CARRIED.inc(len(posts))

    def drop(self, belongs_elsewhere: Callable[[ReadyPost], bool]) -> int:
        """Forget the posts of partitions this worker gave up (after the revocation's checkpoints carried them:
        their next owner restores and decides them). A batch at Triton publishes none of them. Returns how many."""
        kept, sizes, dropped = collections.deque(), collections.deque(), 0
        for post, size in zip(self._queue, self._sizes, strict=True):
            if belongs_elsewhere(post):
                post.dropped = True
                self.queued_bytes -= size
                dropped += 1
            else:
                kept.append(post)
                sizes.append(size)
        self._queue, self._sizes = kept, sizes
        self._queue_bytes.set(self.queued_bytes)
        for batch in self._at_triton.values():
            for post in batch:
                if not post.dropped and belongs_elsewhere(post):
                    post.dropped = True
                    dropped += 1
        if not self._queue:
            self._ready.clear()
        if not self.full:
            self._room.set()
        return dropped

    def submit(self, posts: Sequence[ReadyPost]) -> None:
        if not posts:
            return
        self._queue.extend(posts)
        for p in posts:  # not `source`: the round's handle, shared and not the post's
            # schema-aware bounds: the post and its feature map have known shapes (measuring only their strings)
            size = schema.post_size(p.post) + features_size(p.features) + memory.approx_size(p.ctx)
            self._sizes.append(size)
            self.queued_bytes += size
        self._queue_bytes.set(self.queued_bytes)
        self._ready.set()
        self._more.set()
        if self._runner is None:
            self._runner = asyncio.ensure_future(self._run())

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def over_budget(self) -> bool:
        """The queue holds more bytes than its share."""
        return self.queued_bytes > self.max_bytes

    @property
    def full(self) -> bool:
        """Over its bytes, or holding `max_queued` posts: enough for the next batches (read on the consumer's
        thread too: fetching pauses)."""
        return self.over_budget or len(self._queue) >= self.max_queued

    async def room(self) -> None:
        """Until the queue is no longer `full` (Triton batches take posts off it)."""
        while self.full:
            self._room.clear()
            await self._room.wait()

    def _take(self, n: int) -> list[ReadyPost]:
        batch = [self._queue.popleft() for _ in range(n)]
        self.queued_bytes -= sum(self._sizes.popleft() for _ in range(n))
        self._queue_bytes.set(self.queued_bytes)
        if not self.full:
            self._room.set()
        return batch

    async def _run(self) -> None:
        try:
            while True:
                await self._ready.wait()
                await self._slots.acquire()
                if self._inflight and len(self._queue) < self.max_batch and self.max_wait_s > 0:
                    await self._fill(self.max_wait_s)
                batch = self._take(min(self.max_batch, len(self._queue)))
                if not self._queue:
                    self._ready.clear()
                if not batch:
                    self._slots.release()
                    continue
                self._inflight += 1
                metrics.BATCHES_IN_FLIGHT.inc()
                task = asyncio.ensure_future(self._decide(batch))
                self._tasks.add(task)
                self._at_triton[task] = batch
                task.add_done_callback(self._finished)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # pragma: no cover - a bug here must stop the worker, not stall it
            _log.exception("decision batcher failed")
            self.on_error(exc)

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        self._at_triton.pop(task, None)

    async def _fill(self, timeout: float) -> None:
        """Another batch is at Triton: wait up to `timeout` for this one to fill."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self._queue) < self.max_batch:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._more.clear()
            if not await wait_at_most(self._more.wait(), left):
                return

    async def _decide(self, batch: list[ReadyPost]) -> None:
        try:
            batch = [p for p in batch if not p.dropped]
            scored = [i for i, p in enumerate(batch) if shortcut(p.features) is None]  # bans skip the model
            if scored:
                metrics.BATCH_SIZE.observe(len(scored))
            try:
                probabilities = await self.scorer.spam_probabilities([batch[i].post["text"] for i in scored])
                degraded: set[int] = set()
            except TextModelUnavailable as exc:
                probabilities, degraded = [float("nan")] * len(scored), set(scored)
                _log.warning("deciding without the text model", extra={"posts": len(scored), "error": str(exc)[:300],
                                                                         "policy": self.outage_policy})
            # decided from here on, in this step: no checkpoint may carry these posts now (their decisions are
            # about to be produced), though the task's done callback comes later
            self._at_triton.pop(asyncio.current_task(), None)
            text_p = {i: None if p != p else float(p)  # NaN: the text model is switched off
                      for i, p in zip(scored, probabilities, strict=True)}
            features_list = [features_for(p.features, text_p.get(i)) for i, p in enumerate(batch)]
            verdicts = cascade(self.decider, features_list)
            if self.shadow is not None:
                self.shadow.observe(features_list, verdicts, [p.post["post_id"] for p in batch])
            for i in degraded:
                verdicts[i] = without_text_model(verdicts[i], self.outage_policy)
            # A batch may hold posts of two checkpoint epochs: each post's decision and feedback go into the
            # transaction of its own round (streams/checkpointing/outbox.py), so they are grouped by it.
            # A carried post's decision opens a round of the epoch open now, with its record's tombstone.
            groups: dict[int | str | None, tuple[Pending, list]] = {}
            decided_at, versions = schema.now_ms(), self.publisher.model_versions
            for i, (post, features, verdict) in enumerate(zip(batch, features_list, verdicts, strict=True)):
                if post.dropped:  # its partition went to another worker while Triton answered
                    continue
                epoch = "carried" if post.carried else None if post.source is None else post.source.epoch
                if epoch not in groups:
                    groups[epoch] = (self.open_round() if epoch == "carried" else self._group_pending(batch, epoch), [])
                pending, items = groups[epoch]
                if post.carried:
                    self.carried_decided(post, pending)
                record = self.publisher.record(post.post, verdict, features, post.received_at_ms, decided_at,
                                               degraded=i in degraded, versions=versions)
                items += self.publisher.publish(record, post.ctx, post.received_at_ms, pending)
                if i in degraded:
                    self.publisher.await_text(post, features, record["revision"], pending)
                    metrics.DEGRADED_DECISIONS.labels(self.outage_policy).inc()
                metrics.END_TO_END_LATENCY.observe(record["latency_ms"] / 1000)
            for pending, items in groups.values():
                self.feedback(items, pending)
                pending.seal()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The posts stay unacked, so they are decided again after the restart; crash rather than skip.
            _log.exception("batch failed; stopping the worker so the batch is retried", extra={"error": str(exc)})
            self.on_error(exc)
        finally:
            self._inflight -= 1
            metrics.BATCHES_IN_FLIGHT.dec()
            self._slots.release()

    def _group_pending(self, batch: list[ReadyPost], epoch: int | None) -> Pending:
        """What the decisions of `batch`'s posts of `epoch` wait for; when delivered, their rounds are complete."""
        sources = [p.source for p in batch if not p.carried and p.source is not None and p.source.epoch == epoch]
        return Pending(on_error=self.on_error, on_done=lambda: [source.release() for source in sources],
                       epoch=epoch)

    async def close(self, grace_s: float = 0.0) -> None:
        """Let queued and in-flight batches finish for up to `grace_s` (their posts are then committed), then
        cancel the runner and what is left (those posts stay unacked and are decided after the restart)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while (self._queue or self._tasks) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        tasks = [t for t in (self._runner, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
