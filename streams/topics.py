"""Topic names and the admin step that creates them.

    posts ──ingest──▶ posts.valid ──batching──▶ decisions
      └─ invalid ──▶ posts.dlq

`posts` is keyed by user_id and `posts.valid` keeps that key, so later per-user state stays
co-partitioned with the stream that updates it. Names get MODPIPE_TOPIC_PREFIX in front.
"""

from __future__ import annotations

from dataclasses import dataclass

from modpipe import log
from modpipe.settings import Settings

_log = log.get(__name__)

POSTS = "posts"
REPORTS = "reports"
DECISIONS = "decisions"
DEAD_LETTERS = "posts.dlq"
VALID_POSTS = "posts.valid"  # internal: validated, normalised posts waiting to be scored

ALL = (POSTS, REPORTS, DECISIONS, DEAD_LETTERS, VALID_POSTS)


class TopicConfigError(RuntimeError):
    """An existing topic does not have the layout modpipe needs."""


@dataclass(frozen=True)
class TopicNames:
    posts: str
    reports: str
    decisions: str
    dead_letters: str
    valid_posts: str

    @classmethod
    def from_settings(cls, settings: Settings) -> TopicNames:
        t = settings.topic
        return cls(t(POSTS), t(REPORTS), t(DECISIONS), t(DEAD_LETTERS), t(VALID_POSTS))

    def all(self) -> list[str]:
        return [self.posts, self.reports, self.decisions, self.dead_letters, self.valid_posts]


def ensure_topics(settings: Settings, bootstrap: str | None = None, timeout: float = 30.0) -> list[str]:
    """Create missing topics; refuse existing ones whose partition count differs. Returns the created names."""
    from confluent_kafka.admin import AdminClient, NewTopic

    conf = settings.kafka_client_config()
    if bootstrap:
        conf["bootstrap.servers"] = bootstrap
    admin = AdminClient(conf)
    wanted = TopicNames.from_settings(settings).all()
    existing = admin.list_topics(timeout=timeout).topics
    wrong = {name: len(existing[name].partitions) for name in wanted
             if name in existing and len(existing[name].partitions) != settings.partitions}
    if wrong:
        detail = ", ".join(f"{name} has {n}" for name, n in sorted(wrong.items()))
        raise TopicConfigError(f"topics exist with the wrong partition count (MODPIPE_PARTITIONS="
                               f"{settings.partitions}): {detail}. Delete them or set MODPIPE_PARTITIONS to match.")
    missing = [name for name in wanted if name not in existing]
    if missing:
        futures = admin.create_topics([NewTopic(name, settings.partitions, settings.replication) for name in missing],
                                      operation_timeout=timeout)
        for fut in futures.values():
            try:
                fut.result(timeout)
            except Exception as exc:  # a concurrent creator may have won the race: that is fine
                if "TOPIC_ALREADY_EXISTS" not in str(exc):
                    raise
        _log.info("topics created", extra={"topics": missing, "partitions": settings.partitions})
    return missing
