"""Topic names and the admin step that creates them.

    posts ──ingest + user stage──▶ features.link ──▶ features.ip ──▶ features.post ──▶ decisions
      │   (in place when the post sits on its user's partition, else via features.user)   (+ Triton batches)
      └─ invalid ─▶ posts.dlq
    reports, engagements, labels ──▶ the stage topics of the tables they update
    decisions ──▶ fed back to features.post (and features.user / features.ip when they count it)
    bans ──▶ read in full by every worker (streams/moderation/bans.py), and to features.link (re-decisions)
    posts decided without the text model (an outage) ──▶ posts.awaiting-text ──▶ decided again (revision + 1)

Stage topics (`features.<stage>`, stages in modpipe.features.events.STAGES) carry bundles: one record per
destination partition per round (streams/moderation/bundles.py), placed by the key their tables count (user_id,
registrable domain, ip, post_id), so each table is co-partitioned with the topics that update it. A
post visits only the stages whose key it has. Names get MODPIPE_TOPIC_PREFIX in front; dead letters of
every input topic go to posts.dlq.
"""

from __future__ import annotations

from dataclasses import dataclass

from modpipe.features.events import STAGES, TABLES
from modpipe.streams.state.tables import changelog_topic

from modpipe import log
from modpipe.settings import Settings

_log = log.get(__name__)

POSTS = "posts"
REPORTS = "reports"
ENGAGEMENTS = "engagements"
LABELS = "labels"
BANS = "bans"
DECISIONS = "decisions"
DEAD_LETTERS = "posts.dlq"
AWAITING_TEXT = "posts.awaiting-text"


class TopicConfigError(RuntimeError):
    """An existing topic does not have the layout modpipe needs."""


@dataclass(frozen=True)
class TopicNames:
    posts: str
    reports: str
    engagements: str
    labels: str
    bans: str
    decisions: str
    dead_letters: str
    stages: dict[str, str]  # stage name -> its internal topic `features.<stage>`
    awaiting_text: str  # degraded decisions' posts, decided again once the text model answers
    changelogs: dict[str, str]  # table name -> its changelog topic (streams/state/tables.py)
    incarnations: str  # each worker's incarnation counter (streams/checkpointing/incarnations.py), compacted
    awaiting_model: str  # the changelog of posts waiting for the text model (streams/moderation/carried.py)

    @classmethod
    def from_settings(cls, settings: Settings) -> TopicNames:
        t = settings.topic
        return cls(t(POSTS), t(REPORTS), t(ENGAGEMENTS), t(LABELS), t(BANS), t(DECISIONS), t(DEAD_LETTERS),
                   {stage: t(f"features.{stage}") for stage in STAGES}, t(AWAITING_TEXT),
                   {table: changelog_topic(settings.app_id, table) for table in TABLES},
                   f"{settings.app_id}-worker-incarnations", f"{settings.app_id}-awaiting-model-changelog")

    def inputs(self) -> list[str]:
        """Topics the worker group consumes."""
        return [self.posts, self.reports, self.engagements, self.labels, self.bans, *self.stages.values(),
                self.awaiting_text]

    def all(self) -> list[str]:
        return [*self.inputs(), self.decisions, self.dead_letters, *self.changelogs.values(), self.incarnations,
                self.awaiting_model]


def wait_for_leaders(admin, topics: list[str], timeout: float = 30.0) -> None:
    """Until every partition of `topics` has a leader in the cluster's metadata. Apache Kafka answers a topic's
    creation before its leaders are known everywhere: a ListOffsets or a produce right after it can get
    NOT_LEADER_FOR_PARTITION (the embedded broker has its leader at once)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout)
        waiting = [t for t in topics if t not in md.topics or md.topics[t].error is not None
                   or not md.topics[t].partitions
                   or any(p.leader < 0 or p.error is not None for p in md.topics[t].partitions.values())]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"no leader within {timeout:.0f} s for every partition of {waiting[:5]}")
        time.sleep(0.1)


def ensure_topics(settings: Settings, bootstrap: str | None = None, timeout: float = 30.0) -> list[str]:
    """Create missing topics; refuse existing ones whose partition count differs. Returns the created names."""
    from confluent_kafka.admin import AdminClient, NewTopic

    conf = settings.kafka_client_config()
    if bootstrap:
        conf["bootstrap.servers"] = bootstrap
    admin = AdminClient(conf)
    wanted = TopicNames.from_settings(settings).all()
    metadata = admin.list_topics(timeout=timeout)
    existing = metadata.topics
    wrong = {name: len(existing[name].partitions) for name in wanted
             if name in existing and len(existing[name].partitions) != settings.partitions}
    if wrong:
        detail = ", ".join(f"{name} has {n}" for name, n in sorted(wrong.items()))
        raise TopicConfigError(f"topics exist with the wrong partition count (MODPIPE_PARTITIONS="
                               f"{settings.partitions}): {detail}. Delete them or set MODPIPE_PARTITIONS to match.")
    missing = [name for name in wanted if name not in existing]
    if missing:
        names = TopicNames.from_settings(settings)
        changelogs = {*names.changelogs.values(), names.incarnations, names.awaiting_model}
        # a changelog (and the incarnation counters) needs only each key's last value: compacted
        futures = admin.create_topics([NewTopic(name, settings.partitions, settings.replication_for(len(metadata.brokers)),
                                                config={"cleanup.policy": "compact"} if name in changelogs else {})
                                       for name in missing], operation_timeout=timeout)
        for fut in futures.values():
            try:
                fut.result(timeout)
            except Exception as exc:  # a concurrent creator may have won the race: that is fine
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        wait_for_leaders(admin, missing, timeout)
        _log.info("topics created", extra={"topics": missing, "partitions": settings.partitions})
    return missing
