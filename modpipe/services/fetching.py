"""Fetching from an idle broker without spinning, and without losing a second on each resume.

The embedded broker (noida-db) answers an empty fetch at once instead of waiting `fetch.wait.max.ms`, so a
consumer left assigned to idle partitions makes librdkafka fetch in a tight loop (about half a core in the
client and a third in the broker, measured). Our consumers pause their partitions for a moment after a
poll that brought nothing. librdkafka notices a resume only at its fetcher's next wake-up, ~1 s later
(976 ms from resume to the first record, measured on the embedded broker); a seek wakes it at once. So a
resume seeks each partition to the offset it would fetch next anyway."""

from __future__ import annotations


def resume_now(consumer, tps: list, next_offsets: dict) -> None:
    """Resume `tps` (confluent TopicPartitions) and wake the fetcher. `next_offsets` maps (topic, partition)
    to the offset after the last record the caller was handed (tracked by the caller: `position()` can
    lag behind a seek of the caller's own and would undo it). Partitions not in it resume without a seek."""
    from confluent_kafka import KafkaException, TopicPartition

    consumer.resume(tps)
    for tp in tps:
        key = (tp.topic, tp.partition)
        offset = next_offsets.get(key)
        if offset is None:
            continue
        try:
            consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        except KafkaException:  # a partition whose fetcher is not started yet: it starts on its own
            pass
