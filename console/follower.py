"""The console's Kafka side: follows `posts`, `decisions` and `labels` into the index, publishes labels.

A group-less consumer reads the three topics from MODPIPE_CONSOLE_LOOKBACK_S ago (by record time; the
beginning when the broker holds less), so a console started late still shows the waiting queue; the index
keeps the newest MODPIPE_CONSOLE_MAX_POSTS posts. Records that do not decode are skipped (the pipeline dead-letters bad input; the console only
shows). A label goes to `labels` keyed by post_id, as the platform's own labels do: the pipeline's
label agent updates the post's and its user's features, and every console takes the post off its queue.
"""

from __future__ import annotations

import threading
import uuid

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from modpipe.console.index import DecisionIndex

from modpipe import log, schema
from modpipe.services.fetching import PACED_CONSUMER_CONFIG, paced_fetches
from modpipe.settings import Settings

_log = log.get(__name__)


class Follower(threading.Thread):
    def __init__(self, settings: Settings, bootstrap: str, index: DecisionIndex):
        super().__init__(name="console-follower", daemon=True)
        self.settings, self.index = settings, index
        self.topics = {settings.topic("posts"): self._post, settings.topic("decisions"): self._decision,
                       settings.topic("labels"): self._label}
        self.consumer = Consumer({**settings.kafka_consumer_config(), "bootstrap.servers": bootstrap,
                                  "group.id": f"modpipe-console-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": False, **PACED_CONSUMER_CONFIG})
        self.skipped = 0
        self._halt = threading.Event()

    def _post(self, raw: bytes) -> None:
        self.index.add_post(schema.decode_post(raw, self.settings.max_text_chars))

    def _decision(self, raw: bytes) -> None:
        self.index.add_decision(schema.decode_decision(raw))

    def _label(self, raw: bytes) -> None:
        self.index.add_label(schema.decode_label(raw))

    def start_offsets(self) -> list[TopicPartition]:
        """Each partition's first record at most MODPIPE_CONSOLE_LOOKBACK_S old (its beginning if all are newer;
        if all are older, its end as it was just before the lookup: a symbolic end offset would be resolved
        only when the fetcher starts, skipping what was committed in between)."""
        since_ms = schema.now_ms() - int(self.settings.console_lookback_s * 1000)
        wanted = [TopicPartition(t, p, since_ms) for t in self.topics for p in range(self.settings.partitions)]
        try:
            ends = {(tp.topic, tp.partition): self.consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in wanted}
            found = self.consumer.offsets_for_times(wanted, timeout=10)
        except Exception:  # noqa: BLE001 - a broker without the time index: read everything it holds
            return [TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in wanted]
        return [TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else ends[(tp.topic, tp.partition)])
                for tp in found]

    def run(self) -> None:
        self.consumer.assign(self.start_offsets())
        # paced, as every continuous reader (modpipe/services/fetching.py): an idle console must not spin
        for messages in paced_fetches(self.consumer, self._halt, self.settings.fetch_pause_ms / 1000):
            for msg in messages:
                if msg.value() is None:
                    continue
                try:
                    self.topics[msg.topic()](msg.value())
                except (schema.InvalidMessage, ValueError, KeyError, TypeError):
                    self.skipped += 1
        self.consumer.close()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(5)


class LabelPublisher:
    """`publish(label)` -> the record sent: validated by the same decoder the pipeline uses, delivered
    before it returns (a moderator's click is acknowledged only once the broker has the label)."""

    def __init__(self, settings: Settings, bootstrap: str):
        self.topic = settings.topic("labels")
        self.producer = Producer({**settings.kafka_client_config(), "bootstrap.servers": bootstrap,
                                  "acks": "all", "linger.ms": 0})
        self._lock = threading.Lock()

    def __call__(self, label: dict) -> dict:
        record = schema.decode_label(orjson.dumps({**label, "schema_version": schema.SCHEMA_VERSION,
                                                   "created_at": schema.rfc3339(schema.now_ms())}))
        errors: list = []
        with self._lock:
            self.producer.produce(self.topic, schema.dumps(record), key=record["post_id"].encode(),
                                  on_delivery=lambda err, _msg: errors.append(err) if err else None)
            left = self.producer.flush(10)
        if left or errors:
            raise RuntimeError(f"label not delivered: {errors[0] if errors else 'timeout'}")
        _log.info("label published", extra={"post_id": record["post_id"], "label": record["label"],
                                            "moderator_id": record["moderator_id"]})
        return record
