"""Everything a worker publishes goes through one librdkafka producer, and input is acked only once what
it produced is delivered (at-least-once).

faust's own producer (aiokafka) keeps the table changelogs, and faust flushes it before it commits
offsets. Our outputs (stage bundles, decisions, dead letters) go through confluent-kafka instead: a
`produce()` is a few microseconds of C, where an aiokafka send through faust cost tens of microseconds
of Python per record. faust does not know this producer, so input events are held (their reference
count raised) until a `Pending` group's records are all acknowledged by the broker; only then are they
acked and may faust commit their offsets.

Delivery reports arrive on a librdkafka thread (`poll`); the thread hands them to the event loop in
one call per poll, and all accounting happens on the loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Callable, Iterable

from confluent_kafka import KafkaException, Producer

from modpipe import log
from modpipe.settings import Settings

_log = log.get(__name__)


class DeliveryFailed(RuntimeError):
    """A record could not be delivered within librdkafka's retries (message.timeout.ms)."""


def ack_event(stream, event) -> None:
    """faust's `Stream.ack` without the coroutine (it awaits nothing): one reference released; the offset
    becomes committable when the last one is."""
    last = event.ack()
    message = event.message
    stream._on_stream_event_out(message.tp, message.offset, stream, event)
    if last:
        stream._on_message_out(message.tp, message.offset, message)


class Pending:
    """Holds faust events until everything produced on their behalf is delivered, then acks them.

    Every produce under this group and every explicit `hold()` must be matched by a delivery or a
    `release()`; `seal()` releases the creator's own hold once it has produced everything it will."""

    __slots__ = ("stream", "events", "holds", "on_error", "on_done")

    def __init__(self, stream=None, events: Iterable = (), on_error: Callable[[Exception], None] | None = None,
                 on_done: Callable[[], None] | None = None):
        self.stream = stream
        self.events = list(events)
        for event in self.events:
            event.message.incref()  # released in _finish, after delivery
        self.holds = 1
        self.on_error = on_error
        self.on_done = on_done

    def hold(self, n: int = 1) -> None:
        self.holds += n

    def release(self, error: Exception | None = None) -> None:
        if error is not None:
            if self.on_error is not None:
                self.on_error(error)
            return  # never acked: the input is processed again after the restart that follows
        self.holds -= 1
        if self.holds == 0:
            self._finish()

    def seal(self) -> None:
        self.release()

    def _finish(self) -> None:
        for event in self.events:
            ack_event(self.stream, event)
        if self.on_done is not None:
            self.on_done()


class Outbox:
    """One confluent-kafka producer for a worker's outputs, with delivery tracked per `Pending` group."""

    def __init__(self, settings: Settings, bootstrap: str, *, linger_ms: float):
        self.producer = Producer({
            **settings.kafka_client_config(), "bootstrap.servers": bootstrap,
            "linger.ms": linger_ms, "acks": "all",
            # One record per destination partition per round is already a batch; keep librdkafka's
            # own queue deep enough for a burst of decisions.
            "queue.buffering.max.messages": 1_000_000, "compression.type": "none",
            # Retried batches keep their order within a partition: without it an older changelog state or
            # decision revision could land after a newer one and win.
            "enable.idempotence": True,
            "error_cb": self._on_client_error,
        })
        # called on the event loop when the producer fails for good (a fatal librdkafka error: e.g. a broker
        # that lost acknowledged records breaks the idempotent sequence); the worker must restart
        self.on_fatal: Callable[[Exception], None] | None = None
        # called on the event loop after each batch of delivery reports (persist changelog offsets)
        self.after_delivery: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reports: collections.deque = collections.deque()  # (pending, error) from librdkafka
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> Outbox:
        self._loop = loop
        self._thread = threading.Thread(target=self._poll_forever, name="outbox-delivery", daemon=True)
        self._thread.start()
        return self

    def produce(self, topic: str, value: bytes, *, key: bytes | None = None, partition: int | None = None,
                pending: Pending | None = None, headers: list | None = None,
                on_delivered: Callable[[int], None] | None = None) -> None:
        """Queue one record. `pending` is held until it is delivered; `on_delivered(offset)` runs on the event
        loop after a successful delivery."""
        if pending is not None:
            pending.hold()
        callback = self._callback(pending, on_delivered)
        kwargs = {"key": key, "value": value, "on_delivery": callback}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = headers
        while True:
            try:
                self.producer.produce(topic, **kwargs)
                break
            except BufferError:  # librdkafka's queue is full: wait for deliveries (back-pressure)
                self.producer.poll(0.05)
                self._hand_over()

    def _on_client_error(self, error) -> None:  # librdkafka thread
        if not error.fatal():
            return  # transient (a broker down, a timeout): librdkafka retries, and says so in its own log
        _log.error("producer failed for good; the worker stops", extra={"error": str(error)})
        if self.on_fatal is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self.on_fatal, DeliveryFailed(str(error)))

    def _callback(self, pending: Pending | None, on_delivered: Callable[[int], None] | None):
        reports = self._reports

        def on_delivery(err, msg) -> None:  # librdkafka thread
            reports.append((pending, err, on_delivered, None if err is not None else msg.offset()))
        return on_delivery

    def _poll_forever(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)
            self._hand_over()

    def _hand_over(self) -> None:
        if not self._reports:
            return
        batch = []
        reports = self._reports
        while reports:
            batch.append(reports.popleft())
        self._loop.call_soon_threadsafe(self._on_reports, batch)

    def _on_reports(self, batch: list) -> None:  # event loop thread
        for pending, err, on_delivered, offset in batch:
            if err is None and on_delivered is not None:
                on_delivered(offset)
            if pending is None:
                if err is not None:
                    _log.error("record not delivered", extra={"error": str(err)})
                continue
            pending.release(DeliveryFailed(str(err)) if err is not None else None)
        for hook in self.after_delivery:
            hook()

    async def drain(self, timeout: float) -> int:
        """Wait (off the event loop) until every queued record is delivered or `timeout` passed; returns the
        records left."""
        left = await asyncio.get_running_loop().run_in_executor(None, self.producer.flush, timeout)
        if left:
            _log.warning("records still undelivered after a drain", extra={"records": left})
        return left

    def close(self, timeout: float = 10.0) -> int:
        """Deliver what is queued (up to `timeout`); returns the records left undelivered (-1: unknown)."""
        left = -1
        try:
            left = self.producer.flush(timeout)
            if left:
                _log.warning("outbox closed with undelivered records (their input is processed again)",
                             extra={"records": left})
        except KafkaException as exc:  # pragma: no cover - closing anyway
            _log.warning("outbox flush failed at close", extra={"error": str(exc)})
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)
        return left
