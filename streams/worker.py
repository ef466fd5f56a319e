"""One stream worker process: builds the pipeline, reads the ban log, warms up, then runs the consume ->
process -> checkpoint loop (streams/runtime/runner.py) until stopped; serves metrics and probes."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import signal
import socket
import threading

import orjson
from modpipe.features.events import prepare_post
from modpipe.features.vector import assemble
from modpipe.streams import metrics
from modpipe.streams.checkpointing import incarnations
from modpipe.streams.checkpointing.outbox import Outbox
from modpipe.streams.moderation.agents import Wiring, make_handlers
from modpipe.streams.moderation.app import consumer_config, create_pipeline
from modpipe.streams.moderation.bans import BanLogUnavailable, BanRegistry
from modpipe.streams.moderation.decisions import features_for
from modpipe.streams.moderation.scoring import TextScorer
from modpipe.streams.moderation.topics import ensure_topics
from modpipe.streams.runtime import health
from modpipe.streams.runtime.runner import Runner

from modpipe import exits, log, schema
from modpipe.decision.verdict import Decider, ThresholdDecider
from modpipe.settings import Settings
from modpipe.textmodel.artifacts import resolve_model

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


def transaction_timeout_s(settings: Settings) -> float:
    """transaction.timeout.ms of the worker's producer (MODPIPE_TRANSACTION_TIMEOUT_MS). A checkpoint's transaction
    never waits for Triton (posts still at Triton are carried as state, streams/moderation/carried.py), so it does
    not depend on the text model's settings: a dead worker's open transaction holds read_committed readers at most
    this long, plus the broker's abort check (10 s by default), and its restart fences it sooner
    (streams/checkpointing/incarnations.py). 20 s by default."""
    return settings.transaction_timeout_ms / 1000


def build_worker(settings: Settings, name: str):
    bootstrap = settings.bootstrap()
    ensure_topics(settings, bootstrap)
    build = resolve_model(settings)
    pipe = create_pipeline(settings, name)
    scorer = TextScorer(build, default_triton_url(settings), settings.triton_model, settings.triton_timeout_s,
                        settings.max_seq_len, disabled=settings.text_model == "off",
                        cache_texts=settings.text_cache_size, outage_s=settings.text_model_outage_s,
                        outage_policy=settings.text_model_outage_policy, text_path=settings.text_path)
    decider = make_decider(settings, build.version)
    shadow = make_shadow(settings, build.version)
    bans = BanRegistry(settings, bootstrap, pipe.topics.bans)
    outbox = Outbox(settings, bootstrap, linger_ms=settings.producer_linger_ms,
                    transactional_id=incarnations.start(settings, bootstrap, pipe.topics.incarnations, name),
                    transaction_timeout_ms=int(1000 * transaction_timeout_s(settings)))
    wiring = Wiring(pipe, settings, scorer, decider, bans, outbox, shadow)
    return pipe, scorer, decider, bans, outbox, wiring, bootstrap


# What the warm-up decides: a valid post (schema.decode_post) that no traffic sends. Its text is not ASCII and
# it has a link, so that the feature path's one-off costs (the text fingerprint's class of format characters,
# ~0.1 s; the link parser's suffix list; the brand table) are paid here, not by the first such post.
WARM_UP_POST = {"schema_version": 1, "post_id": "modpipe-warm-up", "user_id": "modpipe-warm-up", "created_at": "2026-01-01T00:00:00Z",
                "text": "warming up the text model \u2014 d\u00e9j\u00e0 vu", "url": "https://warm-up.example.com/modpipe",
                "ip": "192.0.2.1", "journey": [],
                "user": {"created_at": "2026-01-01T00:00:00Z", "email_domain": "example.com", "friends": 0,
                         "followers": 0, "verified": False}}


def warm_up(scorer: TextScorer, decider: Decider, timeout_s: float) -> bool:
    """The first Triton request, the first post's table keys and the first decision, before the worker consumes:
    the posts of its first second would otherwise wait for a cold path (the gRPC channel, the model instance's
    first run, the feature path's one-off tables, the decision model's first call). Runs on a loop of its own (the client binds to its loop and is closed
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
    prepare_post(post)  # the table keys of a post: its text fingerprint and parsed link
    decider.decide_many([features_for(assemble(post, {}), p)])
    return bool(answered) or scorer.disabled


# A worker allocates a few hundred small objects per post and keeps tens of thousands of decoded
# states: with the default thresholds (700, 10, 10) the collector ran every few posts and scanned the
# state cache often, ~10% of the worker's CPU. Collections are rarer, and what exists after start-up
# (modules, the models) is frozen out of them.
GC_THRESHOLDS = (50_000, 20, 100)


def run_worker(settings: Settings, name: str | None = None) -> int:
    """Run one worker until SIGTERM / SIGINT (exit 0) or a failure (exit 1: its supervisor restarts it)."""
    name = name or settings.worker_name or f"{socket.gethostname()}-{os.getpid()}"
    log.dump_stacks_on_signal()  # from here on `kill -USR1` shows where the worker is (docs/operations.md)
    pipe, scorer, decider, bans, outbox, wiring, bootstrap = build_worker(settings, name)
    metrics.init_labels(schema.VERDICTS, schema.InvalidMessage.REASONS,
                        None if scorer.disabled else settings.text_model_outage_policy, tables=list(pipe.tables))
    wiring.observe_tables()
    metrics.MEMORY_LIMIT.set(metrics.cgroup_memory_limit())
    metrics.init_memory(wiring.budgets)
    probes = health.Health()
    probes.live_checks["ban_log_reader"] = bans.alive
    probes.ready_checks.update({"ban_log_read": lambda: bans.is_caught_up, "text_model_warm": lambda: scorer.answered,
                                "partitions_assigned": lambda: wiring.assignments > 0})
    health.serve(settings.metrics_host, settings.metrics_port, probes)
    _log.info("worker starting", extra={"worker": name, "bootstrap": bootstrap, "app_id": settings.app_id,
                                        "metrics": f"http://{settings.metrics_host}:{settings.metrics_port}/metrics",
                                        "triton": scorer.triton_url, "text_model": scorer.model_version})
    bans.start()
    try:
        bans.wait_caught_up(settings.ban_log_timeout_s)
    except BanLogUnavailable as exc:
        _log.error("no post is decided without the ban log; exiting", extra={"error": str(exc)})
        bans.stop()
        return 1
    warm = warm_up(scorer, decider, settings.warm_up_timeout_s)
    _log.info("worker warm", extra={"text_model_answered": warm, "bans_read": bans.is_caught_up})
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return asyncio.run(_serve(settings, name, bootstrap, pipe, scorer, bans, outbox, wiring, decider, probes))


TRIM_EVERY_S = 5.0


async def _trim_forever() -> None:
    """Hand the heap's free pages back to the system every TRIM_EVERY_S (glibc `malloc_trim`). Posts and
    their parsed links come and go between long-lived cache entries and table states; glibc keeps the pages
    they freed, so without it resident memory tracks the high-water mark, not what is in use."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(TRIM_EVERY_S)
        await loop.run_in_executor(None, trim, 0)


async def _serve(settings: Settings, name: str, bootstrap: str, pipe, scorer: TextScorer, bans: BanRegistry,
                 outbox: Outbox, wiring: Wiring, decider: Decider, probes: health.Health) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    crashed: list[BaseException] = []

    abandon: list = []  # the checkpointer's, once the runner exists

    def crash(exc: BaseException) -> None:
        outbox.stop_committing()  # also a checkpoint already under way: the partitions may be another's now
        for give_up in abandon:  # a checkpoint waiting for rounds that will not complete (a revocation's) returns
            give_up()
        if not crashed:
            crashed.append(exc)
            _log.error("worker stops after a failure; what it did not commit is processed again",
                       extra={"error": repr(exc)[:500]})
        stop.set()

    wiring.on_crash = crash
    outbox.on_fatal = crash
    bans.on_failure = lambda exc: loop.call_soon_threadsafe(crash, exc)
    stopped_by = exits.StopOnSignal(stop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped_by, sig)
    log.dump_tasks_on_signal(loop)
    # init_transactions: fences this worker's previous incarnation and aborts what it left open
    await loop.run_in_executor(None, outbox.start, loop)
    _log.info("transactions initialised; joining the group", extra={"transactional_id": outbox.transactional_id})
    runner = Runner(settings, bootstrap, wiring, outbox, make_handlers(wiring, settings, scorer, decider),
                    consumer_config(settings, bootstrap, name))
    runner.consumer.on_failure = crash
    abandon.append(runner.checkpoint.abandon)
    if crashed:  # crashed while the runner was made
        runner.checkpoint.abandon()
    probes.live_checks["consumer"] = runner.consumer.alive
    runner.start()
    trimming = loop.create_task(_trim_forever(), name="malloc-trim")
    await stop.wait()
    trimming.cancel()
    _log.info("worker stopping", extra={"failed": bool(crashed)})
    if crashed:
        runner.consumer.stop_polling()  # no rejoin while it shuts down: its restart rejoins
        runner.committing_on_revoke = False
    else:
        await runner.stop(settings.shutdown_grace_s)
    await wiring.batcher.close()  # what is still at Triton is dropped: it was not committed
    await runner.close()  # leaves the group
    wiring.pipe.close()  # the table stores (what they hold was committed)
    bans.stop()
    await loop.run_in_executor(None, outbox.close)
    await scorer.close()
    _log.info("worker stopped", extra={"failed": bool(crashed), "checkpoints": runner.checkpoint.commits})
    log.stop_dumping_tasks(loop)  # a USR1 after this still dumps stacks, and does not kill the exiting worker
    if outbox.hung():
        # the blocked request's thread would hold the exit for ever (asyncio and the interpreter join the
        # executor's threads): leave without it; the restart's init_transactions fences what it left open
        _log.error("a transaction request is still blocked in librdkafka: the worker exits without waiting for it")
        logging.shutdown()
        os._exit(1)
    return 1 if crashed else stopped_by.status()  # 143 after SIGTERM, 130 after SIGINT

