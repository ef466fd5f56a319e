"""Fetching from an idle broker without spinning, and without losing a second on each resume.

The embedded broker (noida-db) answers an empty fetch at once instead of waiting `fetch.wait.max.ms`, so a
consumer left assigned to idle partitions makes librdkafka fetch in a tight loop (about half a core in the
client and a third in the broker, measured). Our consumers pause their partitions for a moment after a
poll that brought nothing. librdkafka notices a resume only at its broker thread's next wake-up, up to 1 s
later (976 ms from resume to the first record, measured on the embedded broker), and a consumer that pauses
again 10 ms after each resume can miss that wake-up for seconds: records produced to a worker idle for a
while waited 1.4-4.4 s, always a whole second plus 0.44 s (10 topics x 4 partitions, 400 records). A seek to
the offset it would fetch next anyway helps only a partition that has delivered records; any request to
the broker wakes the thread: after a resume, one ListOffsets request (0.2 ms) brought the first record in
8-40 ms."""

from __future__ import annotations

WAKE_TIMEOUT_S = 0.5


def resume_now(consumer, tps: list, next_offsets: dict) -> None:
    """Resume `tps` (confluent TopicPartitions) and wake the fetcher. `next_offsets` maps (topic, partition)
    to the offset after the last record the caller was handed (tracked by the caller: `position()` can
    lag behind a seek of the caller's own and would undo it). Partitions not in it resume without a seek."""
    from confluent_kafka import KafkaException, TopicPartition

    if not tps:
        return
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
    try:  # wakes the broker thread, which then sees the resumed partitions and fetches them
        consumer.get_watermark_offsets(tps[0], timeout=WAKE_TIMEOUT_S, cached=False)
    except KafkaException:  # no answer in time: the thread wakes on its own, as without the request
        pass
