"""The faust agents: thin wiring between topics and the plain logic in `modpipe.schema`, `scoring`, `verdict`.

ingest:   posts -> decode + validate + normalise -> the first feature stage | posts.dlq
          (the feature stages are in `feature_agents.py`; they end on posts.enriched)
batching: posts.enriched -> up to MODPIPE_MAX_BATCH posts or MODPIPE_MAX_WAIT_MS -> bans short-circuit
          -> one Triton request for the rest -> the decider (modpipe.decision) -> one decision per post
          -> decisions (and the verdict, with the snapshot it was made from, back to the feature tables)

At-least-once: an input offset is acked (and so committed) only after everything it produced is
delivered. The batching agent keeps up to MODPIPE_MAX_INFLIGHT batches at Triton at once without
agent concurrency (faust-streaming #606): it holds an extra reference on each message until its
decision is delivered, and faust commits only the contiguous acked prefix of each partition.
"""

from __future__ import annotations

import asyncio

import orjson

from modpipe import log, schema
from modpipe.decision.engine import cascade, shortcut
from modpipe.decision.verdict import Decider
from modpipe.settings import Settings
from streams import metrics
from streams.app import Pipeline
from streams.bans import BanRegistry
from streams.dead_letters import event_source, event_timestamp_ms, send_dead_letter
from streams.feature_agents import attach_feature_agents, publish_decision, start_post
from streams.scoring import TextScorer

_log = log.get(__name__)

INGEST_BATCH = 500        # records decoded per round; their forwards are awaited together
INGEST_WAIT_S = 0.005


def features_for(envelope: dict, text_probability: float | None) -> dict:
    """The feature map of the decision: the feature stages' map plus the text model's probability."""
    return {**envelope["features"],
            "text_probability": None if text_probability is None else round(float(text_probability), 6)}


def attach_agents(pipe: Pipeline, settings: Settings, scorer: TextScorer, decider: Decider,
                  bans: BanRegistry) -> None:
    app = pipe.app
    model_versions = {"text_model": "off" if scorer.disabled else scorer.model_version, "decider": decider.version}
    inflight = asyncio.Semaphore(settings.max_inflight)
    tasks: set[asyncio.Task] = set()

    attach_feature_agents(pipe, bans, decider, model_versions, settings.redecide_reports)

    @app.agent(pipe.posts, name="ingest")
    async def ingest(stream):
        async for events in stream.take_events(INGEST_BATCH, within=INGEST_WAIT_S):
            deliveries = []
            for event in events:
                metrics.POSTS_CONSUMED.inc()
                try:
                    post = schema.decode_post(event.value, settings.max_text_chars)
                except schema.InvalidMessage as exc:
                    deliveries.append(await send_dead_letter(pipe, event, exc))
                    continue
                envelope = {"post": post, "received_at_ms": event_timestamp_ms(event), "source": event_source(event)}
                deliveries.append(await start_post(pipe, envelope))
            # Delivered before this round's offsets are acked (take_events acks after the body).
            await asyncio.gather(*deliveries)

    async def decide_batch(stream, events) -> None:
        try:
            envelopes = []
            for event in events:
                try:
                    envelopes.append(orjson.loads(event.value))
                except orjson.JSONDecodeError as exc:  # only if someone else writes to our internal topic
                    await (await send_dead_letter(pipe, event, exc))
            # Cascade: a post a ban decides never reaches the text model.
            scored = [i for i, env in enumerate(envelopes) if shortcut(env["features"]) is None]
            if scored:
                metrics.BATCH_SIZE.observe(len(scored))
            probabilities = await scorer.spam_probabilities([envelopes[i]["post"]["text"] for i in scored])
            text_p = {i: None if p != p else float(p)  # NaN: the text model is switched off
                      for i, p in zip(scored, probabilities, strict=True)}
            features_list = [features_for(env, text_p.get(i)) for i, env in enumerate(envelopes)]
            verdicts = cascade(decider, features_list)
            deliveries = []
            decided_at = schema.now_ms()
            for env, features, verdict in zip(envelopes, features_list, verdicts, strict=True):
                record = schema.decision(
                    post=env["post"], verdict=verdict.verdict, spam_probability=verdict.spam_probability,
                    text_probability=features["text_probability"], reasons=verdict.reasons, features=features,
                    short_circuit=verdict.short_circuit, model_versions=model_versions,
                    received_at_ms=env["received_at_ms"], decided_at_ms=decided_at)
                deliveries.extend(await publish_decision(pipe, record, env["ctx"], env["received_at_ms"]))
                metrics.END_TO_END_LATENCY.observe(record["latency_ms"] / 1000)
            await asyncio.gather(*deliveries)
            for event in events:
                await stream.ack(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The batch stays unacked, so it is redone after restart; crash rather than skip it.
            _log.exception("batch failed; stopping the worker so the batch is retried", extra={"error": str(exc)})
            await app.crash(exc)
        finally:
            metrics.BATCHES_IN_FLIGHT.dec()
            inflight.release()

    @app.agent(pipe.enriched_posts, name="batching")
    async def batching(stream):
        async for events in stream.take_events(settings.max_batch, within=settings.max_wait_ms / 1000):
            for event in events:
                event.message.incref()  # released in decide_batch once the decisions are delivered
            await inflight.acquire()
            metrics.BATCHES_IN_FLIGHT.inc()
            task = asyncio.ensure_future(decide_batch(stream, list(events)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    inputs = set(pipe.topics.inputs())

    @app.on_partitions_assigned.connect
    async def on_assigned(app, assigned, **kwargs) -> None:
        for topic in inputs:
            metrics.ASSIGNED_PARTITIONS.labels(topic).set(sum(tp.topic == topic for tp in assigned))

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
