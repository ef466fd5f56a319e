"""The faust application: settings -> faust.App with the topics its agents read and the feature tables.
Agents are attached in `agents.py`; what the worker publishes goes through `outbox.py`."""

from __future__ import annotations

import ssl
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import faust

from features.events import TABLES
from modpipe import log
from modpipe.settings import Settings
from streams.topics import TopicNames

_log = log.get(__name__)


def broker_urls(bootstrap: str) -> list[str]:
    return [f"kafka://{host.strip()}" for host in bootstrap.split(",") if host.strip()]


def broker_credentials(settings: Settings):
    """SASL / TLS for real clusters; None for PLAINTEXT."""
    protocol = settings.security_protocol.upper()
    context = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=settings.ssl_cafile or None)
    if protocol.startswith("SASL"):
        mechanism = settings.sasl_mechanism or "PLAIN"
        if mechanism.startswith("SCRAM"):
            return faust.SASLCredentials(username=settings.sasl_username, password=settings.sasl_password,
                                         ssl_context=context, mechanism=mechanism)
        return faust.SASLCredentials(username=settings.sasl_username, password=settings.sasl_password,
                                     ssl_context=context)
    if context is not None:
        return faust.SSLCredentials(context)
    return None


class PipelineApp(faust.App):
    """faust's App with `before_stop` hooks, run when the app starts stopping, before faust stops its consumer.

    At shutdown faust waits until every event its streams took is acked (stream_wait_empty). Posts waiting
    for an unreachable Triton are never acked, so a worker ignored SIGTERM for as long as Triton was down
    (issue #14). The hooks cancel such work; its events stay unacked, so faust must not wait for them:
    wait_empty is off for the rest of the shutdown (rebalances keep it). Their offsets are not committed and
    the posts are decided after the restart (at-least-once, as after a SIGKILL)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.before_stop: list[Callable[[], Awaitable[None]]] = []

    async def on_stop(self) -> None:
        for hook in self.before_stop:
            try:
                await hook()
            except Exception:  # a failing hook must not keep the worker from stopping
                _log.exception("before-stop hook failed")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # faust warns that a setting changes after start: it is meant to
            self.conf.stream_wait_empty = False
        await super().on_stop()


@dataclass
class Pipeline:
    """The app, the topics its agents read and the tables."""

    app: PipelineApp
    topics: TopicNames
    posts: faust.TopicT
    side_inputs: dict[str, faust.TopicT]   # event kind -> topic (report, engagement, label)
    bans: faust.TopicT
    stages: dict[str, faust.TopicT]        # stage name -> its stage topic (bundles)
    awaiting_text: faust.TopicT            # posts decided during a text-model outage, to decide again
    tables: dict[str, faust.Table]         # table name -> faust table (changelog-backed)
    partitions: int


def rocksdb_options(settings: Settings) -> dict | None:
    """Memory bounds of each table partition's RocksDB (one per table per partition: 20 with 4 partitions).
    faust's defaults (64 MiB write buffers x 3 and a 2 GiB block cache, per partition) made a worker's memory
    grow for many minutes under steady load (the soak run in docs/benchmarks.md)."""
    if settings.table_store != "rocksdb":
        return None
    return {"write_buffer_size": settings.rocksdb_write_buffer_mb * 1024 * 1024, "max_write_buffer_number": 2,
            "block_cache_size": settings.rocksdb_block_cache_mb * 1024 * 1024}


def create_app(settings: Settings, bootstrap: str, worker_name: str = "worker-0") -> Pipeline:
    names = TopicNames.from_settings(settings)
    # Per app id: faust's RocksDB store keeps one offset per partition database whatever the topic, so an
    # app reusing another app's table directory (new topics) died with ConsistencyError at recovery.
    datadir = settings.state_dir / "faust" / settings.app_id / worker_name
    datadir.parent.mkdir(parents=True, exist_ok=True)
    app = PipelineApp(
        settings.app_id,
        broker=broker_urls(bootstrap),
        broker_credentials=broker_credentials(settings),
        store="rocksdb://" if settings.table_store == "rocksdb" else "memory://",
        datadir=str(datadir),
        topic_partitions=settings.partitions,
        topic_replication_factor=settings.replication,
        topic_allow_declare=True,
        consumer_auto_offset_reset="earliest",
        processing_guarantee="at_least_once",
        # Static membership: a restarted worker with the same name takes its partitions back at once
        # instead of waiting for its old session to expire (and noida-db never expires it: docs/operations.md).
        consumer_group_instance_id=f"{settings.app_id}-{worker_name}",
        producer_acks=-1,
        producer_linger=0.005,
        # Rebalances are quick with a short session timeout; noida-db and Kafka accept >= 6 s.
        broker_session_timeout=10,
        broker_heartbeat_interval=2,
        broker_commit_interval=1.0,
        web_enabled=True,
        web_bind="127.0.0.1",
        web_host="127.0.0.1",
        web_port=settings.web_port,
        value_serializer="raw",
        key_serializer="raw",
    )
    # Our topics are created by the admin step (`ensure_topics`) with the configured partitions.
    def topic(name: str) -> faust.TopicT:
        return app.topic(name, key_type=bytes, value_type=bytes, value_serializer="raw", key_serializer="raw",
                         partitions=settings.partitions)

    # Keys are str and values the plain dicts of features.state: untyped, so faust keeps them as JSON.
    tables = {name: app.Table(f"features-{name}", default=None, partitions=settings.partitions,
                              options=rocksdb_options(settings)) for name in TABLES}
    return Pipeline(
        app=app, topics=names, posts=topic(names.posts),
        side_inputs={"report": topic(names.reports), "engagement": topic(names.engagements),
                     "label": topic(names.labels)},
        bans=topic(names.bans), stages={name: topic(t) for name, t in names.stages.items()},
        awaiting_text=topic(names.awaiting_text),
        tables=tables, partitions=settings.partitions)
