"""A partition's watermarks, asked again while the cluster has no leader for it yet.

Apache Kafka answers a topic's creation before the new partitions' leaders serve requests, and a killed
node's partitions have no leader until the controller elects another: a ListOffsets then fails with
NOT_LEADER_FOR_PARTITION or LEADER_NOT_AVAILABLE (the embedded broker, one process, never says either).
librdkafka does not retry those in `get_watermark_offsets`; every reader of end offsets goes through here."""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException

# _DESTROY, _DESTROY_BROKER: librdkafka dropped the connection object of a node the cluster's metadata no longer
# lists (a killed node, fenced by the controller) while a request to it was out; the next try goes to the
# partition's new leader
NOT_YET = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
           KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._DESTROY, KafkaError._DESTROY_BROKER,
           KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN}
RETRY_S = 0.2


def watermarks(client, tp, timeout: float = 10.0, *, topic_may_be_new: bool = True) -> tuple[int, int]:
    """(low, high) of `tp` from a Consumer, retried on a missing leader until `timeout` has passed.
    `topic_may_be_new=False`: a topic the cluster does not know is an error at once (a changelog to restore
    is created before any worker runs)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.get_watermark_offsets(tp, timeout=max(0.5, deadline - time.monotonic()))
        except KafkaException as exc:
            err = exc.args[0]
            unknown = err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            again = (err.retriable() or err.code() in NOT_YET) and (topic_may_be_new or not unknown)
            if not again or time.monotonic() + RETRY_S > deadline:
                raise
            time.sleep(RETRY_S)
