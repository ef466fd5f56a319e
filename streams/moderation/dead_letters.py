"""Dead letters: bad input is published to posts.dlq with its origin and reason; nothing is dropped."""

from __future__ import annotations

from modpipe.streams import metrics
from modpipe.streams.checkpointing.outbox import Outbox, Pending

from modpipe import log, schema

_log = log.get(__name__)


def event_source(event) -> dict:
    msg = event.message
    return {"topic": msg.topic, "partition": msg.partition, "offset": msg.offset}


def event_timestamp_ms(event) -> int:
    ts = event.message.timestamp_ms
    return ts if ts and ts > 0 else schema.now_ms()


def send_dead_letter(outbox: Outbox, topic: str, event, error: Exception, pending: Pending,
                     raw: bytes | None = None) -> None:
    """Publish a dead letter for `event` (or for `raw`, one item of a bundle record) under `pending`."""
    msg = event.message
    reason = getattr(error, "reason", "processing_error")
    metrics.DEAD_LETTERS.labels(reason).inc()
    _log.warning("dead letter", extra={"reason": reason, "error": str(error)[:300], **event_source(event)})
    if raw is None:
        raw = event.value if isinstance(event.value, bytes) else msg.value
    record = schema.dead_letter(topic=msg.topic, partition=msg.partition, offset=msg.offset, key=msg.key,
                                raw=raw, error=error)
    outbox.produce(topic, schema.dumps(record), key=msg.key, pending=pending)
