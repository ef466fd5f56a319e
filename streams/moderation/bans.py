"""Bans known to every worker: each worker reads the whole `bans` topic itself (no consumer group),
`read_committed`.

A post's stage checks the bans of its domain and ip whatever partition those keys live on, so every
worker needs every ban: a log that each worker reads from the beginning is exact and simple, and bans are
few. The `bans` topic's handler in the group (streams/moderation/agents.py) validates and dead-letters bad records and
sends each ban to the tables it updates; this reader skips invalid records.

A worker decides nothing before the reader has read the log up to the end offsets it found at start
(`wait_caught_up`): a post decided right after a restart must not miss a ban. A reader that dies (the
log cannot be read) is never silent: `modpipe_ban_log_reader_up` drops to 0, the worker's readiness and
liveness fail, and `on_failure` stops the worker so that its supervisor restarts it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from modpipe.features import events as fe
from modpipe.features.state import DEFAULT_LIMITS, load_state
from modpipe.streams import metrics

from modpipe import log, schema
from modpipe.settings import Settings

_log = log.get(__name__)

IDLE_BACKOFF_S = 0.25


class BanLogUnavailable(RuntimeError):
    """The ban log could not be read to its end (the worker must not decide without it)."""


class BanRegistry:
    def __init__(self, settings: Settings, bootstrap: str, topic: str,
                 on_failure: Callable[[Exception], None] | None = None):
        self.settings, self.bootstrap, self.topic = settings, bootstrap, topic
        self.on_failure = on_failure
        self._states: dict[str, object] = {}
        self._stop = threading.Event()
        self._caught_up = threading.Event()
        self._thread: threading.Thread | None = None
        self.failure: Exception | None = None

    def is_banned(self, key: str) -> bool:
        state = self._states.get(key)
        return bool(state is not None and state.banned)

    def apply(self, raw_value: bytes) -> bool:
        """Apply one record of the ban log; False when it is invalid (dead-lettered by the ingest agent)."""
        try:
            ctx = fe.prepare_ban(schema.decode_ban(raw_value))
        except schema.InvalidMessage:
            return False
        if not ctx["key"]:
            return False
        state = self._states.get(ctx["key"]) or load_state(fe.BANS, None, DEFAULT_LIMITS)
        if state.apply("ban", ctx).changed:
            self._states[ctx["key"]] = state  # one reference swap: readers never see a half update
        metrics.BAN_EVENTS_APPLIED.inc()
        return True

    @property
    def is_caught_up(self) -> bool:
        return self._caught_up.is_set()

    def alive(self) -> bool:
        """The reader runs (or has not been started) and has not failed."""
        return self.failure is None and (self._thread is None or self._thread.is_alive() or self._stop.is_set())

    def start(self) -> BanRegistry:
        metrics.BAN_LOG_READER_UP.set(1)
        self._thread = threading.Thread(target=self._run, name="ban-log-reader", daemon=True)
        self._thread.start()
        return self

    def wait_caught_up(self, timeout: float, progress_every_s: float = 10.0) -> None:
        """Block until the log is read to the end offsets found at start; raises `BanLogUnavailable` when the
        reader failed or `timeout` passed first."""
        deadline = time.monotonic() + timeout
        while not self._caught_up.wait(min(progress_every_s, max(0.0, deadline - time.monotonic()))):
            if self.failure is not None:
                raise BanLogUnavailable(f"the ban log reader failed: {self.failure}") from self.failure
            if time.monotonic() >= deadline:
                raise BanLogUnavailable(f"the ban log {self.topic!r} was not read to its end within {timeout:.0f} s")
            _log.info("waiting for the ban log to be read before deciding", extra={"topic": self.topic})
        if self.failure is not None:
            raise BanLogUnavailable(f"the ban log reader failed: {self.failure}") from self.failure

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(5)

    def _run(self) -> None:
        # partition EOF events say when a partition is read to its end (read_committed: its last stable
        # offset, past any transaction markers), which is what "caught up" means
        conf = {**self.settings.kafka_client_config(), "bootstrap.servers": self.bootstrap,
                "group.id": f"{self.settings.app_id}-bans-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
                "isolation.level": "read_committed", "enable.partition.eof": True}
        consumer = Consumer(conf)
        try:
            partitions = consumer.list_topics(self.topic, timeout=30).topics[self.topic].partitions
            if not partitions:
                raise BanLogUnavailable(f"topic {self.topic!r} has no partitions (does it exist?)")
            consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])
            tps = consumer.assignment()
            at_end: set[int] = set()
            while not self._stop.is_set():
                msg = consumer.poll(0.1)
                if msg is not None:
                    if not msg.error():
                        self.apply(msg.value())
                        continue
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        _log.warning("ban log read error", extra={"error": str(msg.error())})
                        continue
                    at_end.add(msg.partition())
                    if not self._caught_up.is_set() and at_end.issuperset(partitions):
                        self._caught_up.set()
                        metrics.BAN_LOG_CAUGHT_UP.set(1)
                        _log.info("ban log read to its end", extra={"topic": self.topic, "banned": len(self._states)})
                    continue
                if self._caught_up.is_set():
                    # Nothing new: stop fetching for a moment. A broker that answers an empty fetch at once
                    # instead of waiting fetch.wait.max.ms (noida-db does) made this idle reader cost half a
                    # core (measured 0.54 cores vs 0.003 with the pause); a ban waits at most this long.
                    consumer.pause(tps)
                    self._stop.wait(IDLE_BACKOFF_S)
                    consumer.resume(tps)
        except Exception as exc:  # noqa: BLE001 - never silent: metric, readiness, and the worker stops
            self.failure = exc
            metrics.BAN_LOG_READER_UP.set(0)
            _log.exception("ban log reader failed; the worker stops")
            if self.on_failure is not None:
                self.on_failure(exc)
        finally:
            consumer.close()
