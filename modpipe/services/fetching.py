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
8-40 ms.

Under load the same spin came back: a consumer that kept getting records never paused, so librdkafka fetched
in a tight loop all the time (a reader left resumed on the decisions topic: 0.49 cores in the client and 0.35
in the broker; paced as below: 0.13 and 0.08, measured). So every consumer that reads continuously paces its
fetches: its partitions are resumed for one fetch window, which ends once every partition has answered, with
records or an end-of-partition event (PACED_CONSUMER_CONFIG turns those on; after a resume librdkafka reports
each partition still at its end), or FETCH_WAIT_S after the resume; then the partitions pause for
MODPIPE_FETCH_PAUSE_MS, unless the window brought a backlog's worth of records. A window that ended on a 3 ms
timer instead sent ~8 fetches to a broker that answers at once; ending it at the answer sends one, and halved
what an idle paced reader costs its client and cut the broker's share by 3-5x (a reader of 40 partitions at
20 ms pauses: 0.12 -> 0.05-0.08 cores and 0.07 -> 0.014-0.023, with the same first-record latency)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from confluent_kafka import KafkaError

WAKE_TIMEOUT_S = 0.5
FETCH_WAIT_S = 0.010  # at most this long for a fetch window's answer (it usually comes in well under 1 ms)
BACKLOG_RECORDS = 100  # a window that brought this many is followed by the next at once: the partitions have a
#                        backlog (fetches are not empty), and a pause would only slow the catch-up
START_GRACE_S = 2.0  # no pause this soon after an assignment: a partition paused before its fetcher started
#                      is not woken by a seek (a fresh consumer's first records waited 6 s, measured)
# What a paced consumer's configuration adds: librdkafka reports each partition whose fetch found nothing new
# (an end-of-partition event after every resume), so a window can end at its fetch's whole answer.
PACED_CONSUMER_CONFIG = {"enable.partition.eof": True}


def _reported(m) -> tuple[str, int] | None:
    """The partition a message or end-of-partition event speaks for (None for other errors)."""
    err = m.error()
    if err is None or err.code() == KafkaError._PARTITION_EOF:
        return m.topic(), m.partition()
    return None


def fetch_window(consumer, max_messages: int, timeout_s: float, expect=None,
                 clock: Callable[[], float] = time.monotonic) -> list:
    """The messages and events of one fetch. Waits up to `timeout_s` for the first; with `expect` (the
    partitions just resumed, as (topic, partition)), goes on until every one of them has answered, with
    records or an end-of-partition event (the whole answer of the fetch), or `timeout_s` has passed; then
    takes what else is already queued without waiting. Ending the window at the answer instead of on a
    timer sends one fetch per window where the embedded broker, answering at once, got ~8 in 3 ms."""
    deadline = clock() + timeout_s
    out = consumer.consume(1, timeout_s)
    if not out or max_messages <= 1:
        return out
    out += consumer.consume(max_messages - 1, 0)
    if not expect:
        return out
    waiting = set(expect).difference(filter(None, map(_reported, out)))
    while waiting and len(out) < max_messages:
        left = deadline - clock()
        if left <= 0:
            break
        more = consumer.consume(1, left)
        if not more:
            break
        more += consumer.consume(max_messages - len(out) - 1, 0)
        waiting.difference_update(filter(None, map(_reported, more)))
        out += more
    return out


def paced_fetches(consumer, stop: threading.Event, pause_s: float, *, next_offsets: dict | None = None,
                  max_messages: int = 500, grace_s: float = START_GRACE_S,
                  clock: Callable[[], float] = time.monotonic) -> Iterator[list]:
    """A reader's loop (no group, no back-pressure): yields each fetch window's messages (errors left out) until
    `stop` is set; from `grace_s` on, the partitions pause for `pause_s` after every window that brought fewer
    than BACKLOG_RECORDS. `next_offsets` (see `resume_now`) is kept up to date with the messages yielded."""
    next_offsets = {} if next_offsets is None else next_offsets
    started = clock()
    while not stop.is_set():
        tps = consumer.assignment()
        window = fetch_window(consumer, max_messages, FETCH_WAIT_S, expect=[(tp.topic, tp.partition) for tp in tps])
        messages = [m for m in window if m.error() is None]
        for m in messages:
            next_offsets[(m.topic(), m.partition())] = m.offset() + 1
        yield messages
        if pause_s > 0 and len(messages) < BACKLOG_RECORDS and clock() - started >= grace_s:
            consumer.pause(tps)
            stop.wait(pause_s)
            resume_now(consumer, tps, next_offsets)


def resume_now(consumer, tps: list, next_offsets: dict, sought=frozenset()) -> None:
    """Resume `tps` (confluent TopicPartitions) and wake the fetcher. `next_offsets` maps (topic, partition)
    to the offset after the last record the caller was handed (tracked by the caller: `position()` can
    lag behind a seek of the caller's own and would undo it). librdkafka resumes a partition from its
    consumed position by itself, as a pause makes that the next to fetch (`rd_kafka_toppar_pause_resume`),
    and a seek is a broker-thread op per partition per window (a worker at 5 posts/s: 0.22-0.25 cores with
    one each, 0.20-0.21 without; docs/benchmarks.md). So a partition is sought only where its position
    differs from `next_offsets` and the position cannot be right: behind it, or ahead of it while the caller's
    own seek there (a partition in `sought`) has not delivered a record yet. A position ahead of a partition
    not in `sought` went past a transaction's marker or aborted records, which a read_committed consumer
    never delivers: it is taken into `next_offsets` instead of sought back to (and skipped again).
    Partitions not in `next_offsets` resume without a seek."""
    from confluent_kafka import KafkaException, TopicPartition

    if not tps:
        return
    consumer.resume(tps)
    known = [TopicPartition(tp.topic, tp.partition) for tp in tps if (tp.topic, tp.partition) in next_offsets]
    try:
        positions = consumer.position(known) if known else []
    except KafkaException:  # no positions to compare: seek every partition, as is always safe
        positions = known
    for tp in positions:
        key = (tp.topic, tp.partition)
        offset = next_offsets[key]
        if tp.offset == offset:
            continue
        if tp.offset > offset and key not in sought:
            next_offsets[key] = tp.offset
            continue
        try:
            consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        except KafkaException:  # a partition whose fetcher is not started yet: it starts on its own
            pass
    try:  # wakes the broker thread, which then sees the resumed partitions and fetches them
        consumer.get_watermark_offsets(tps[0], timeout=WAKE_TIMEOUT_S, cached=False)
    except KafkaException:  # no answer in time: the thread wakes on its own, as without the request
        pass
