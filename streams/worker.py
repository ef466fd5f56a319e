"""One stream worker process: builds the faust app, attaches the agents, serves metrics, runs until stopped."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import threading

import faust
import orjson
from faust.exceptions import ConsistencyError

from features.vector import assemble
from modpipe import log, schema
from modpipe.decision.verdict import Decider, ThresholdDecider
from modpipe.settings import Settings
from modpipe.textmodel.artifacts import resolve_model
from streams import health, kafka_compat, metrics
from streams.agents import attach_agents
from streams.app import create_app
from streams.bans import BanLogUnavailable, BanRegistry
from streams.decisions import features_for
from streams.local_tables import (
    ChangelogEnds,
    discard_after_unclean_stop,
    discard_ahead,
    discard_named,
    mark_clean_stop,
)
from streams.outbox import Outbox
from streams.scoring import TextScorer
from streams.topics import ensure_topics

_log = log.get(__name__)


def default_triton_url(settings: Settings) -> str:
    return settings.triton_url or f"127.0.0.1:{settings.triton_grpc_port}"


def make_decider(settings: Settings, text_model_version: str) -> Decider:
    """MODPIPE_DECIDER: the LightGBM engine (refuses a model trained on another feature list), reloaded when
    its pointer moves (modpipe/decision/live.py), or text-only."""
    if settings.decider == "text-only":
        return ThresholdDecider(settings.review_threshold, settings.block_threshold)
    from modpipe.decision.live import WatchedDecider
    from modpipe.decision.store import load_engine, resolve_decision_model

    def load(path):
        engine = load_engine(settings, text_model_version, path)
        trained_on = engine.model.meta.get("text_model_version")
        if trained_on != text_model_version:
            _log.warning("the decision model was trained on another text model; its calibration may be off",
                         extra={"decision_model": engine.version, "trained_on": trained_on,
                                "served": text_model_version})
        return engine

    return WatchedDecider(load, lambda: resolve_decision_model(settings, text_model_version),
                          settings.decision_model_watch_s)


def make_shadow(settings: Settings, text_model_version: str):
    """MODPIPE_SHADOW_DECISION_MODEL: a candidate scored beside the serving model (None when unset)."""
    if not settings.shadow_decision_model:
        return None
    from pathlib import Path

    from modpipe.decision.live import ShadowScorer
    from modpipe.decision.store import load_engine

    shadow = ShadowScorer(load_engine(settings, text_model_version, Path(settings.shadow_decision_model).expanduser()))
    _log.info("shadow decision model loaded", extra={"shadow": shadow.version})
    return shadow


def build_worker(settings: Settings, name: str | None = None):
    name = name or settings.worker_name or f"{socket.gethostname()}-{os.getpid()}"
    bootstrap = settings.bootstrap()
    ensure_topics(settings, bootstrap)
    build = resolve_model(settings)
    pipe = create_app(settings, bootstrap, worker_name=name)
    scorer = TextScorer(build, default_triton_url(settings), settings.triton_model, settings.triton_timeout_s,
                        settings.max_seq_len, disabled=settings.text_model == "off",
                        cache_texts=settings.text_cache_size, outage_s=settings.text_model_outage_s,
                        outage_policy=settings.text_model_outage_policy)
    decider = make_decider(settings, build.version)
    shadow = make_shadow(settings, build.version)
    bans = BanRegistry(settings, bootstrap, pipe.topics.bans)
    outbox = Outbox(settings, bootstrap, linger_ms=settings.producer_linger_ms)
    wiring = attach_agents(pipe, settings, scorer, decider, bans, outbox, shadow=shadow)
    return pipe, scorer, decider, bans, outbox, wiring, bootstrap


# What the warm-up decides: a valid post (schema.decode_post) that no traffic sends.
WARM_UP_POST = {"schema_version": 1, "post_id": "modpipe-warm-up", "user_id": "modpipe-warm-up", "created_at": "2026-01-01T00:00:00Z",
                "text": "warming up the text model", "url": None, "ip": "192.0.2.1", "journey": [],
                "user": {"created_at": "2026-01-01T00:00:00Z", "email_domain": "example.com", "friends": 0,
                         "followers": 0, "verified": False}}


def warm_up(scorer: TextScorer, decider: Decider, timeout_s: float) -> bool:
    """The first Triton request and the first decision, before the worker consumes: the posts of its first
    second would otherwise wait for a cold path (the gRPC channel, the model instance's first run, the
    decision model's first call). Runs on a loop of its own (the client binds to its loop and is closed
    after). Returns whether Triton answered; a worker that could not reach it starts anyway."""
    post = schema.decode_post(orjson.dumps(WARM_UP_POST))
    answered: list[float] = []

    async def first_request() -> None:
        try:
            answered.extend(await asyncio.wait_for(scorer.spam_probabilities([post["text"]]), timeout_s))
        finally:
            await scorer.close()

    def run() -> None:
        try:
            asyncio.run(first_request())
        except Exception as exc:  # noqa: BLE001 - Triton down at start: outage handling takes over
            _log.warning("text model warm-up failed; starting anyway", extra={"error": str(exc)[:300]})

    if not scorer.disabled:
        thread = threading.Thread(target=run, name="warm-up")
        thread.start()
        thread.join()
    p = answered[0] if answered else None
    decider.decide_many([features_for(assemble(post, {}), p)])
    return bool(answered) or scorer.disabled


# A worker allocates a few hundred small objects per post and keeps tens of thousands of decoded
# states: with the default thresholds (700, 10, 10) the collector ran every few posts and scanned the
# state cache often, ~10% of the worker's CPU. Collections are rarer, and what exists after start-up
# (modules, the models) is frozen out of them.
GC_THRESHOLDS = (50_000, 20, 100)


def run_worker(settings: Settings, name: str | None = None) -> int:
    kafka_compat.install()
    name = name or settings.worker_name or f"{socket.gethostname()}-{os.getpid()}"
    pipe, scorer, decider, bans, outbox, wiring, bootstrap = build_worker(settings, name)
    metrics.init_labels(schema.VERDICTS, schema.InvalidMessage.REASONS,
                        None if scorer.disabled else settings.text_model_outage_policy)
    probes = health.Health()
    probes.live_checks["ban_log_reader"] = bans.alive
    probes.ready_checks.update({"ban_log_read": lambda: bans.is_caught_up, "text_model_warm": lambda: scorer.answered,
                                "partitions_assigned": lambda: wiring.assignments > 0})
    health.serve(settings.metrics_host, settings.metrics_port, probes)
    _log.info("worker starting", extra={"worker": name, "bootstrap": bootstrap, "app_id": settings.app_id,
                                        "metrics": f"http://{settings.metrics_host}:{settings.metrics_port}/metrics",
                                        "triton": scorer.triton_url, "text_model": scorer.model_version})
    worker = faust.Worker(pipe.app, loglevel=logging.getLevelName(logging.getLogger().level),
                          override_logging=False, redirect_stdouts=False)

    async def _stop_deciding() -> None:
        # Before faust waits for its streams: batches get MODPIPE_SHUTDOWN_GRACE_S to finish, then are
        # cancelled; a batch retrying an unreachable Triton would otherwise hold the shutdown for ever.
        await wiring.batcher.close(settings.shutdown_grace_s)

    pipe.app.before_stop.append(_stop_deciding)

    undelivered = [-1]  # records the outbox could not deliver at close (-1: it did not close)

    @pipe.app.on_before_shutdown.connect
    async def _close_client(app, **kwargs) -> None:
        bans.stop()
        # Batches still at Triton are dropped: their posts were never acked and are decided after restart.
        await wiring.batcher.close()
        wiring.flush_states()
        undelivered[0] = outbox.close()
        await scorer.close()

    tabledir = pipe.app.conf.tabledir
    if settings.table_store == "rocksdb":
        discard_after_unclean_stop(tabledir)
        ends = ChangelogEnds(settings, bootstrap)
        try:
            discard_ahead(tabledir, settings.app_id, ends)
        finally:
            ends.close()
    loop = pipe.app.loop
    # From the reader's thread: faust's crash stops the worker (exit non-zero) and its supervisor restarts it.
    bans.on_failure = lambda exc: loop.call_soon_threadsafe(wiring.crash, exc)
    bans.start()
    try:
        bans.wait_caught_up(settings.ban_log_timeout_s)
    except BanLogUnavailable as exc:
        _log.error("no post is decided without the ban log; exiting", extra={"error": str(exc)})
        bans.stop()
        outbox.close(1.0)
        return 1
    warm = warm_up(scorer, decider, settings.warm_up_timeout_s)
    _log.info("worker warm", extra={"text_model_answered": warm, "bans_read": bans.is_caught_up})
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        worker.execute_from_commandline()  # returns via SystemExit when stopped (SIGTERM / SIGINT)
    except SystemExit:
        if worker.crash_reason is None and undelivered[0] == 0:
            mark_clean_stop(tabledir)  # the stores hold nothing the changelogs lack: keep them
        if isinstance(worker.crash_reason, ConsistencyError):
            discard_named(tabledir, settings.app_id, str(worker.crash_reason))  # the restart rebuilds it
        raise
    return 0
