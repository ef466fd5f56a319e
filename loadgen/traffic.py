"""Rate control and producing: when each post arrives, and putting the simulation's events on Kafka.

Patterns (all with mean rate `rate` posts/s):
- `constant`: evenly spaced, exactly rate * duration posts.
- `poisson`:  exponential gaps (a homogeneous Poisson process).
- `burst`:    Poisson arrivals whose rate is 0.25x for 8 s then 4x for 2 s, every 10 s.
- `ramp`:     Poisson arrivals whose rate grows linearly from 0 to 2x over the run.

Arrival offsets are seeded and computed, never measured: `arrival_times` is pure. `produce_events`
paces the events on the wall clock (an event is produced when its offset is due; when the producer
falls behind it catches up without sleeping), keys each record as the pipeline expects and puts the
ground truth in the `modpipe-truth` header only. It records, per post, both when it was scheduled and when
it was produced: latency counted from the produce() call hides the time a post waited for a producer that
fell behind (coordinated omission), so reports count from the schedule, as wrk2 and HdrHistogram do.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import orjson
from modpipe.simulation.simulator import KIND_TOPICS, TRUTH_HEADER, Event

from modpipe import log, schema
from modpipe.settings import Settings

_log = log.get(__name__)

PATTERNS = ("constant", "poisson", "burst", "ramp")
BURST_PERIOD_S, BURST_LEN_S, BURST_HIGH, BURST_LOW = 10.0, 2.0, 4.0, 0.25  # 0.25*8 + 4*2 = 10 = period
LOGICAL_TOPICS = ("posts", "reports", "engagements", "labels", "bans", "decisions")


def _cum_inverse(pattern: str, rate: float, duration_s: float | None) -> Callable[[float], float]:
    """Inverse of the cumulative intensity Λ(t) = expected arrivals by t: returns t for Λ = n."""
    if pattern in ("constant", "poisson"):
        return lambda n: n / rate
    if pattern == "burst":
        per_period = rate * BURST_PERIOD_S
        quiet = rate * BURST_LOW * (BURST_PERIOD_S - BURST_LEN_S)

        def inv(n: float) -> float:
            k, rem = divmod(n, per_period)
            if rem <= quiet:
                return k * BURST_PERIOD_S + rem / (rate * BURST_LOW)
            return k * BURST_PERIOD_S + (BURST_PERIOD_S - BURST_LEN_S) + (rem - quiet) / (rate * BURST_HIGH)
        return inv
    if pattern == "ramp":
        if not duration_s:
            raise ValueError("the ramp pattern needs a duration (or a count to derive one)")
        # rate(t) = 2 * rate * t / D  ->  Λ(t) = rate * t² / D
        return lambda n: math.sqrt(n * duration_s / rate)
    raise ValueError(f"unknown pattern {pattern!r}; choose from {PATTERNS}")


def arrival_times(pattern: str, rate: float, duration_s: float | None = None, count: int | None = None,
                  seed: int = 0) -> Iterator[float]:
    """Post arrival offsets in seconds, non-decreasing, until `duration_s` or `count`, whichever first."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if duration_s is None and count is None:
        raise ValueError("give a duration, a count or both")
    if pattern == "ramp" and duration_s is None:
        duration_s = count / rate
    inv = _cum_inverse(pattern, rate, duration_s)
    rng = random.Random(f"arrivals:{seed}:{pattern}")
    n, i = 0.0, 0
    while count is None or i < count:
        t = inv(n)
        if duration_s is not None and t >= duration_s:
            return
        yield t
        i += 1
        n += 1.0 if pattern == "constant" else rng.expovariate(1.0)


def planned_posts(pattern: str, rate: float, duration_s: float | None, count: int | None) -> int:
    """Posts the run will produce: exact for `constant`, the expectation otherwise."""
    by_time = math.ceil(rate * duration_s) if duration_s is not None else None
    if by_time is None:
        return int(count)
    return by_time if count is None else min(by_time, int(count))


# ---------------------------------------------------------------------------------------------- topics

def ensure_loadgen_topics(settings: Settings, bootstrap: str, timeout: float = 30.0) -> list[str]:
    """Create the topics the generator writes to (and `decisions`) when missing; idempotent.

    New topics get the partition count of `posts` when that exists, else MODPIPE_PARTITIONS."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({**settings.kafka_client_config(), "bootstrap.servers": bootstrap})
    metadata = admin.list_topics(timeout=timeout)
    existing = metadata.topics
    posts = existing.get(settings.topic("posts"))
    partitions = len(posts.partitions) if posts is not None and posts.partitions else settings.partitions
    missing = [settings.topic(t) for t in LOGICAL_TOPICS if settings.topic(t) not in existing]
    if not missing:
        return []
    futures = admin.create_topics([NewTopic(name, partitions, settings.replication_for(len(metadata.brokers)))
                                   for name in missing],
                                  operation_timeout=timeout)
    for fut in futures.values():
        try:
            fut.result(timeout)
        except Exception as exc:  # another creator won the race: fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    from modpipe.streams.moderation.topics import wait_for_leaders

    wait_for_leaders(admin, missing, timeout)
    _log.info("loadgen topics created", extra={"topics": missing, "partitions": partitions})
    return missing


# ---------------------------------------------------------------------------------------------- producing

@dataclass
class ProduceStats:
    sent_at: dict[str, float] = field(default_factory=dict)  # post_id -> wall time (s) of produce()
    scheduled_at: dict[str, float] = field(default_factory=dict)  # post_id -> wall time (s) it was due
    truth: dict[str, dict] = field(default_factory=dict)  # post_id -> ground truth
    by_kind: dict[str, int] = field(default_factory=dict)
    delivery_errors: int = 0
    started: float | None = None
    finished: float | None = None
    behind_s_max: float = 0.0  # how far the producer fell behind the schedule at worst

    @property
    def posts(self) -> int:
        return len(self.sent_at)

    @property
    def events(self) -> int:
        return sum(self.by_kind.values())


def headers_for(event: Event) -> list[tuple[str, bytes]]:
    return [(TRUTH_HEADER, orjson.dumps(event.truth))]


def produce_events(producer, settings: Settings, events: Iterable[Event], *, stats: ProduceStats | None = None,
                   progress=None, stop: threading.Event | None = None,
                   clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                   wall: Callable[[], float] = time.time) -> ProduceStats:
    """Produce `events` at their offsets. `producer` is a confluent_kafka.Producer (or a fake in tests).

    `progress` (tqdm-like, optional) is advanced by one per post."""
    stats = stats or ProduceStats()
    topics = {kind: settings.topic(name) for kind, name in KIND_TOPICS.items()}

    def on_delivery(err, _msg):
        if err is not None:
            stats.delivery_errors += 1

    t0 = clock()
    stats.started = wall()
    for event in events:
        if stop is not None and stop.is_set():
            break
        due = t0 + event.offset_s
        while True:
            now = clock()
            if now >= due:
                break
            sleep(min(due - now, 0.05))
            producer.poll(0)
        late = clock() - due  # >= 0: the loop above left at or after `due`
        stats.behind_s_max = max(stats.behind_s_max, late)
        value = schema.dumps(event.payload)
        if event.kind == "post":
            pid = event.payload["post_id"]
            stats.truth[pid] = event.truth
            stats.sent_at[pid] = wall()
            # the lateness is measured on the monotonic clock, so a wall-clock step cannot put a post's
            # schedule after its produce
            stats.scheduled_at[pid] = stats.sent_at[pid] - late
        while True:
            try:
                producer.produce(topics[event.kind], key=event.key.encode(), value=value, headers=headers_for(event),
                                 on_delivery=on_delivery)
                break
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.05)
        producer.poll(0)
        stats.by_kind[event.kind] = stats.by_kind.get(event.kind, 0) + 1
        if progress is not None and event.kind == "post":
            progress.update(1)
    stats.finished = wall()
    return stats


def make_producer(settings: Settings, bootstrap: str, *, idempotent: bool = True, ready_timeout_s: float = 0.0):
    """`idempotent=False` for a producer that must outlive a restart of the embedded broker: noida-db forgets
    producer ids and sequence numbers when it restarts, and librdkafka's idempotent producer then fails for
    good (OUT_OF_ORDER_SEQUENCE_NUMBER, fatal). Apache Kafka keeps that state across restarts. Without
    idempotence a retried send may be written twice; the pipeline counts a post once whatever its copies.

    `ready_timeout_s`: wait (up to that long) until an idempotent producer has its producer id. librdkafka
    gets one right after connecting, but a record produced before that waits for its next idempotence timer
    tick: the first record took 500-1,000 ms (measured on the embedded broker), and a latency measured from
    the produce() call would count it."""
    from confluent_kafka import Producer

    ready = threading.Event()

    def on_stats(raw: str) -> None:  # librdkafka keeps sending them: parsed only until the id is there
        if not ready.is_set() and orjson.loads(raw).get("eos", {}).get("idemp_state") == "Assigned":
            ready.set()

    waiting = idempotent and ready_timeout_s > 0
    # murmur2: Kafka's Java default for keyed records. A post keyed by user_id then sits on the partition
    # its user's table lives on, and the worker updates the user table in place (no extra hop).
    producer = Producer({**settings.kafka_client_config(), "bootstrap.servers": bootstrap, "linger.ms": 2,
                         "enable.idempotence": idempotent, "acks": "all", "queue.buffering.max.messages": 200_000,
                         "partitioner": "murmur2_random",
                         **({"statistics.interval.ms": 250, "stats_cb": on_stats} if waiting else {})})
    deadline = time.monotonic() + ready_timeout_s
    while waiting and not ready.is_set() and time.monotonic() < deadline:
        producer.poll(0.05)
    if waiting and not ready.is_set():
        _log.warning("the producer has no producer id yet; its first records may wait for it",
                     extra={"waited_s": ready_timeout_s})
    return producer
