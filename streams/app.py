"""The faust application: settings -> faust.App with the topics its agents read and the feature tables.
Agents are attached in `agents.py`; what the worker publishes goes through `outbox.py`."""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import faust

from features.events import TABLES
from modpipe.settings import Settings
from streams.topics import TopicNames


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


@dataclass
class Pipeline:
    """The app, the topics its agents read and the tables."""

    app: faust.App
    topics: TopicNames
    posts: faust.TopicT
    side_inputs: dict[str, faust.TopicT]   # event kind -> topic (report, engagement, label)
    bans: faust.TopicT
    stages: dict[str, faust.TopicT]        # stage name -> its stage topic (bundles)
    tables: dict[str, faust.Table]         # table name -> faust table (changelog-backed)
    partitions: int


def create_app(settings: Settings, bootstrap: str, worker_name: str = "worker-0") -> Pipeline:
    names = TopicNames.from_settings(settings)
    # Per app id: faust's RocksDB store keeps one offset per partition database whatever the topic, so an
    # app reusing another app's table directory (new topics) died with ConsistencyError at recovery.
    datadir = settings.state_dir / "faust" / settings.app_id / worker_name
    datadir.parent.mkdir(parents=True, exist_ok=True)
    app = faust.App(
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
        # instead of waiting for its old session to expire (and noida-db never expires it, see README).
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
    tables = {name: app.Table(f"features-{name}", default=None, partitions=settings.partitions) for name in TABLES}
    return Pipeline(
        app=app, topics=names, posts=topic(names.posts),
        side_inputs={"report": topic(names.reports), "engagement": topic(names.engagements),
                     "label": topic(names.labels)},
        bans=topic(names.bans), stages={name: topic(t) for name, t in names.stages.items()},
        tables=tables, partitions=settings.partitions)
