"""Posts waiting for the text model across checkpoints: kept as state, never inside an open transaction.

A checkpoint (streams/checkpointing/checkpoint.py, step 3) waits for its epoch's decisions at most
MODPIPE_CHECKPOINT_MODEL_WAIT_MS. A post still at Triton (or queued for it) then is *carried*: its ready form
(post, feature map, where its verdict goes) is written as a changelog record of the `awaiting-model` table in the
checkpoint's transaction, beside the post table's state that marks its id as seen and the input offsets that
brought it, and its round counts as complete. When its decision is made, later, the decision, its feedback and a
tombstone of the carried record go into the transaction open then, as a round of that epoch. So no Kafka
transaction is held open while Triton answers: a Triton outage of any length costs no transaction and no restart,
and `transaction.timeout.ms` need not cover Triton's waits (Flink's async I/O snapshots the requests in flight the
same way).

The table is partitioned like the post stage (key post_id): its partition p lives with post-stage partition p, its
changelog end goes into that partition's offset-commit metadata (streams/state/ends.py), and the partition's next
owner restores it with the post table and hands every post it holds to its own decision batcher. A revoked
partition's posts are dropped from this worker's batcher after the revocation's last checkpoint carried them
(`DecisionBatcher.drop`): only their new owner decides them.

The store is in memory whatever MODPIPE_STATE_BACKEND says: it holds only posts not decided yet (bounded by the
decision queue's share of memory), and its compacted changelog is read from the start at a restore.
"""

from __future__ import annotations

import orjson
from modpipe.streams.moderation.bundles import partition_for
from modpipe.streams.moderation.stages import ReadyPost
from modpipe.streams.state.table_states import ChangelogWriter
from modpipe.streams.state.tables import Table, encode_key

from modpipe import log

_log = log.get(__name__)

TABLE = "awaiting-model"  # the name its changelog end is carried under, beside the post table's


def make_table(changelog: str) -> Table:
    """The table's partitions on this worker; `changelog`: `TopicNames.awaiting_model`."""
    return Table(TABLE, changelog)


def encode(post: ReadyPost) -> dict:
    return {"post": post.post, "received_at_ms": post.received_at_ms, "ctx": post.ctx, "features": post.features}


def decode(value: dict, partition: int) -> ReadyPost:
    return ReadyPost(post=value["post"], received_at_ms=int(value["received_at_ms"]), ctx=value["ctx"],
                     features=value["features"], partition=partition, carried=True)


class CarriedPosts:
    """The `awaiting-model` table of this worker's post-stage partitions, written through the outbox."""

    def __init__(self, table: Table, outbox, ends, partitions: int):
        self.table, self.partitions = table, partitions
        self._writer = ChangelogWriter(table, outbox, ends)

    def partition_of(self, post: ReadyPost) -> int:
        if post.partition < 0:
            post.partition = partition_for(post.post["post_id"], self.partitions)
        return post.partition

    def carry(self, post: ReadyPost, pending) -> None:
        """Keep `post` as state: its record goes into `pending`'s transaction."""
        partition = self.partition_of(post)
        data = self.table.set(post.post["post_id"], encode(post), partition)
        self._writer.produce(encode_key(post.post["post_id"]), data, partition, pending)
        post.carried = True

    def decided(self, post: ReadyPost, pending) -> None:
        """The carried post's decision is in `pending`'s transaction: so is the tombstone of its record."""
        partition = self.partition_of(post)
        self.table.delete(post.post["post_id"], partition)
        self._writer.produce(encode_key(post.post["post_id"]), None, partition, pending)

    def restored(self, partitions) -> list[ReadyPost]:
        """The posts the restored `partitions` hold, oldest carried first: to be decided by this worker."""
        out = []
        for p in sorted(partitions):
            for key, (data, _) in self.table.partitions.get(p, {}).items():
                try:
                    out.append(decode(orjson.loads(data), p))
                except (KeyError, TypeError, ValueError, orjson.JSONDecodeError) as exc:  # not written by modpipe
                    _log.error("a record of the awaiting-model changelog is not a carried post; skipped",
                               extra={"changelog": self.table.changelog, "partition": p, "key": str(key)[:200],
                                      "error": str(exc)[:200]})
        return out
