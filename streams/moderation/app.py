"""What a worker is made of, before it runs: its topics, its feature tables, and the Kafka client settings
of its consumer and producer (from `Settings`: bootstrap servers, SASL / TLS)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from modpipe.features.events import POST, TABLES
from modpipe.streams.moderation import carried
from modpipe.streams.moderation.topics import TopicNames
from modpipe.streams.state import rocksdb
from modpipe.streams.state.tables import Table, make_tables

from modpipe import memory
from modpipe.settings import Settings


@dataclass
class Pipeline:
    """The topics a worker reads and writes, and its tables (the partitions it holds)."""

    topics: TopicNames
    tables: dict[str, Table]  # table name -> its partitions on this worker, changelog-backed
    partitions: int
    # posts waiting for the text model across checkpoints, partitioned like the post stage (carried.py)
    awaiting_model: Table = None

    def __post_init__(self):
        if self.awaiting_model is None:
            self.awaiting_model = carried.make_table(self.topics.awaiting_model)

    def close(self) -> None:
        for table in self.tables.values():
            table.close()


def retention_ms(settings: Settings) -> dict[str, int]:
    """Feature table -> how long it keeps a key not written since (0: for ever)."""
    return {t: int(1000 * (settings.post_retention_s if t == POST else settings.feature_retention_s)) for t in TABLES}


def tables_dir(settings: Settings, worker_name: str) -> Path:
    """Where a worker keeps its RocksDB tables: its own directory (two workers on one host never share a store;
    a worker restarted under its name finds its stores again)."""
    return settings.state_dir / "tables" / settings.app_id / worker_name


def create_pipeline(settings: Settings, worker_name: str = "worker") -> Pipeline:
    if settings.state_backend == "rocksdb":
        tables = rocksdb.make_tables(settings.app_id, tables_dir(settings, worker_name),
                                     memory.budget_bytes("table_store", settings.worker_memory_mb),
                                     retention_ms(settings))
    else:
        tables = make_tables(settings.app_id, retention_ms(settings))
    return Pipeline(topics=TopicNames.from_settings(settings), tables=tables, partitions=settings.partitions)


def consumer_config(settings: Settings, bootstrap: str, worker_name: str) -> dict:
    """The group consumer's librdkafka settings (streams/kafka/consumer.py adds what correctness needs)."""
    conf = {**settings.kafka_client_config(), "bootstrap.servers": bootstrap, "group.id": settings.app_id,
            # The classic protocol, on purpose: its client-side range assignor gives partition p of every input
            # topic to one worker, so each stage's tables live with the partitions that feed them; and its eager
            # rebalances revoke every partition before any moves, which the runner's hand-over relies on (it
            # drops fetched batches at a revocation). KIP-848's `consumer` protocol assigns on the broker
            # (uniform by default) with incremental callbacks: neither holds there (docs/operations.md).
            "group.protocol": "classic",
            # Rebalances are quick with a short session timeout; noida-db and Kafka accept >= 6 s.
            "session.timeout.ms": 10_000, "heartbeat.interval.ms": 2_000,
            "fetch.wait.max.ms": 100, "queued.max.messages.kbytes": 16_384,
            # the rebalance callbacks run inside the poll call: an assignment's committed offsets are waited for up
            # to 240 s, a revocation's commit up to 660 s (streams/kafka/consumer.py; tables are restored off the
            # callback); the group must not drop the worker meanwhile
            "max.poll.interval.ms": 900_000}
    if settings.static_membership == "on":
        # A restarted worker with the same name takes its partitions back at once instead of waiting for its
        # old session to expire (docs/operations.md: static membership).
        conf["group.instance.id"] = f"{settings.app_id}-{worker_name}"
    return conf

