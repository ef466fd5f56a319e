"""`modpipe bench transport`: the delivery options for exactly-once output, side by side in one run.

Each pass takes `records / 10` inputs (4 partitions) in a consumer group, produces 10 records of 300 bytes
for each over 4 partitions of 3 topics (a worker's bundles, changelog records, decision), linger 5 ms, acks
all, and commits the input offsets as its option does:
1. `confluent_idempotent`: one idempotent producer; a confluent consumer commits a checkpoint's offsets once
   all its records are delivered (at-least-once, the outbox's shape).
2. `confluent_txn`: one transactional producer; each checkpoint `send_offsets_to_transaction` (with
   `consumer_group_metadata()`) and `commit_transaction`.
3. `aiokafka_txn`: a transactional producer per input partition (faust's "exactly_once"), each checkpoint
   sending its offsets and committing in turn.
4. `aiokafka_plain`: one producer (faust's at-least-once changelog path); flush, then commit.
Inputs are fetched and the consumer paused before the clock starts (noida-db answers an empty fetch at once,
so a consumer at the log's end spins: ~0.4 cores for librdkafka's). Measured all inputs at once (saturation)
and at `paced_rate` inputs/s: records/s to the last commit, CPU of this process (all threads; main thread
apart) and of the broker per record, the commit's duration (option 1: checkpoint -> all delivered); then
what read_committed and read_uncommitted consumers read and the committed offsets. A pass's topics are
deleted after it and the next waits for an idle broker (noida-db rewrites its whole state file about every
second: ~0.9 cores while it holds 500,000 records). cProfile of paced passes of options 2 and 3 (main-thread
CPU) says where the Python time went.
"""

from __future__ import annotations

import asyncio
import collections
import cProfile
import os
import pstats
import random
import time
import uuid
from typing import NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from modpipe.loadgen.bench.metering import CpuMeter, group_cpu_seconds
from modpipe.loadgen.bench.transport_report import BASELINE, add_ratios, checks_ok, percentile, top_own_time

from modpipe.settings import RECEIVE_MESSAGE_MAX_BYTES

RECORDS_PER_INPUT, PARTITIONS, OUT_TOPICS, VALUE_BYTES, LINGER_MS = 10, 4, 3, 300, 5
TICK_S = 0.005  # paced passes: inputs are handed out in rounds this far apart (about one fetch's)
DEFAULT_RECORDS = 500_000
DEFAULT_PACED_RATE, DEFAULT_PACED_S = 1000.0, 4.0
DEFAULT_INTERVALS_MS = (50, 100, 250, 1000)
DEFAULT_AIOKAFKA_INTERVALS_MS = (100, 1000)
_rng = random.Random(0)
VALUES = [_rng.randbytes(VALUE_BYTES) for _ in range(64)]
KEYS = [f"user-{i:05d}".encode() for i in range(1000)]


class Names(NamedTuple):
    input: str
    outputs: tuple[str, ...]
    group: str


def names_for(tag: str, label: str) -> Names:
    base = f"bench.transport.{tag}.{label}"
    return Names(f"{base}.in", tuple(f"{base}.out{i}" for i in range(OUT_TOPICS)), base)


class _Meter:
    """Wall, process CPU (all threads), main-thread CPU and the broker's CPU from the first input on."""

    def __init__(self, broker_pid: int | None):
        self._broker = (lambda: group_cpu_seconds({"b": broker_pid})["b"]) if broker_pid else None
        self.b0 = self._broker() if self._broker else None
        self.t0, self.c0, self.m0 = time.perf_counter(), time.process_time(), time.thread_time()

    def stop(self, n: int, commit_s: list[float]) -> dict:
        wall = time.perf_counter() - self.t0
        us = lambda s: round(1e6 * s / n, 2)  # noqa: E731
        ms = [1000 * s for s in commit_s]
        p50, p99 = percentile(ms, 50), percentile(ms, 99)
        return {"records": n, "seconds": round(wall, 3), "records_per_s": round(n / wall, 1),
                "cpu_us_per_record": us(time.process_time() - self.c0),
                "main_thread_us_per_record": us(time.thread_time() - self.m0),
                "broker_cpu_us_per_record": us(self._broker() - self.b0) if self._broker else None,
                "commits": len(ms), "commit_ms_p50": p50 and round(p50, 2), "commit_ms_p99": p99 and round(p99, 2)}


class _Epoch:
    """The records produced between two checkpoints; its offsets may be committed once `left` is 0."""
    __slots__ = ("left", "offsets", "closed_at", "errors")

    def __init__(self):
        self.left, self.offsets, self.closed_at, self.errors = 0, None, None, 0

    def ack(self, err, _msg) -> None:
        self.left -= 1
        self.errors += err is not None


def _commit_delivered(consumer, epochs: collections.deque, lat: list, topic: str, sync: bool = False) -> None:
    last, now = None, time.perf_counter()
    while epochs and epochs[0].left == 0:
        last = epochs.popleft()
        if last.errors:
            raise RuntimeError(f"{last.errors} records were not delivered")
        lat.append(now - last.closed_at)
    if last is not None:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in last.offsets.items()], asynchronous=not sync)


class _Pacer:
    """Hands out buffered input records: all of them, or at most `rate` per second since the first one."""

    def __init__(self, rate: float | None):
        self.rate, self.buf, self.t0 = rate, collections.deque(), 0.0

    def take(self, seen: int, batch: int = 1000) -> list:
        n = batch if self.rate is None else int(self.rate * (time.perf_counter() - self.t0)) + 1 - seen
        return [self.buf.popleft() for _ in range(min(n, batch, len(self.buf)))]


def confluent_pass(bootstrap: str, names: Names, n_in: int, interval_ms: int, txn: bool, broker_pid=None,
                   rate: float | None = None) -> dict:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": names.group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    conf = {"bootstrap.servers": bootstrap, "linger.ms": LINGER_MS, "acks": "all", "enable.idempotence": True,
            "queue.buffering.max.messages": 1_000_000}
    producer = Producer({**conf, "transactional.id": f"{names.group}-tx"} if txn else conf)
    outs = names.outputs
    if txn:
        producer.init_transactions(30)
        producer.begin_transaction()
    for topic in outs:  # metadata and the producer id now, not in the first measured round
        producer.list_topics(topic, timeout=10)
    consumer.subscribe([names.input])
    pacer = _Pacer(rate)
    while len(pacer.buf) < n_in:
        pacer.buf.extend(m for m in consumer.consume(1000, 0.5) if not m.error())
    consumer.pause(consumer.assignment())  # fetched: an idle fetcher spins on noida-db (see the module's doc)
    epochs, epoch, offsets, lat = collections.deque(), _Epoch(), {}, []
    seen = out = 0
    meter = _Meter(broker_pid)
    pacer.t0, interval = meter.t0, interval_ms / 1000.0
    due = meter.t0 + interval
    while seen < n_in:
        msgs = pacer.take(seen)
        for m in msgs:
            for _ in range(RECORDS_PER_INPUT):
                args = (outs[out % OUT_TOPICS], VALUES[out % 64], KEYS[out % 1000], (out // OUT_TOPICS) % PARTITIONS)
                try:
                    producer.produce(*args, on_delivery=None if txn else epoch.ack)
                except BufferError:  # librdkafka's queue is full: deliver it, then go on
                    producer.flush(60)
                    producer.produce(*args, on_delivery=None if txn else epoch.ack)
                out += 1
            offsets[m.partition()] = m.offset() + 1
        seen += len(msgs)
        epoch.left += RECORDS_PER_INPUT * len(msgs)
        producer.poll(0 if msgs or rate is None else TICK_S)
        if epochs and epochs[0].left == 0:
            _commit_delivered(consumer, epochs, lat, names.input)
        now = time.perf_counter()
        if now < due and seen < n_in:
            continue
        due = now + interval
        if txn:
            producer.send_offsets_to_transaction([TopicPartition(names.input, p, o) for p, o in offsets.items()],
                                                 consumer.consumer_group_metadata())
            t = time.perf_counter()
            producer.commit_transaction()
            lat.append(time.perf_counter() - t)
            if seen < n_in:
                producer.begin_transaction()
        else:
            epoch.offsets, epoch.closed_at = dict(offsets), now
            epochs.append(epoch)
            epoch = _Epoch()
            _commit_delivered(consumer, epochs, lat, names.input)
    if not txn:
        producer.flush(60)
        _commit_delivered(consumer, epochs, lat, names.input, sync=True)
    result = meter.stop(out, lat)
    consumer.close()
    return result


async def aiokafka_pass(bootstrap: str, names: Names, n_in: int, interval_ms: int, txn: bool, broker_pid=None,
                        rate: float | None = None) -> dict:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as TP

    consumer = AIOKafkaConsumer(names.input, bootstrap_servers=bootstrap, group_id=names.group,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    common = {"bootstrap_servers": bootstrap, "linger_ms": LINGER_MS, "acks": "all"}
    if txn:
        producers = {p: AIOKafkaProducer(**common, transactional_id=f"{names.group}-{p}") for p in range(PARTITIONS)}
    else:
        producers = dict.fromkeys(range(PARTITIONS), AIOKafkaProducer(**common))
    await consumer.start()
    for prod in set(producers.values()):
        await prod.start()
        for topic in names.outputs:  # metadata now, not in the first measured round
            await prod.partitions_for(topic)
        if txn:
            await prod.begin_transaction()
    pacer = _Pacer(rate)
    while len(pacer.buf) < n_in:
        for msgs in (await consumer.getmany(timeout_ms=500, max_records=1000)).values():
            pacer.buf.extend(msgs)
    consumer.pause(*consumer.assignment())
    outs, offsets, dirty, lat = names.outputs, {}, set(), []
    seen = out = 0
    meter = _Meter(broker_pid)
    pacer.t0, interval = meter.t0, interval_ms / 1000.0
    due = meter.t0 + interval
    while seen < n_in:
        msgs = pacer.take(seen)
        for m in msgs:
            prod = producers[m.partition]
            for _ in range(RECORDS_PER_INPUT):
                await prod.send(outs[out % OUT_TOPICS], VALUES[out % 64], key=KEYS[out % 1000],
                                partition=(out // OUT_TOPICS) % PARTITIONS)
                out += 1
            offsets[m.partition] = m.offset + 1
            dirty.add(m.partition)
        seen += len(msgs)
        if not msgs and rate is not None:
            await asyncio.sleep(TICK_S)
        now = time.perf_counter()
        if now < due and seen < n_in:
            continue
        due = now + interval
        if txn:  # as faust's commit_transactions: each producer in turn
            for p in sorted(dirty):
                await producers[p].send_offsets_to_transaction({TP(names.input, p): offsets[p]}, names.group)
                t = time.perf_counter()
                await producers[p].commit_transaction()
                lat.append(time.perf_counter() - t)
                if seen < n_in:
                    await producers[p].begin_transaction()
            dirty.clear()
        else:  # as faust's at-least-once commit: flush the producer, then commit
            t = time.perf_counter()
            await producers[0].flush()
            await consumer.commit({TP(names.input, p): o for p, o in offsets.items()})
            lat.append(time.perf_counter() - t)
    result = meter.stop(out, lat)
    for prod in set(producers.values()):
        await prod.stop()
    await consumer.stop()
    return result


def create_topics(bootstrap: str, names: Names, delete: bool = False) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = (names.input, *names.outputs)
    futures = admin.delete_topics(list(topics)) if delete else admin.create_topics([NewTopic(t, PARTITIONS, 1)
                                                                                    for t in topics])
    for fut in futures.values():
        fut.result(30)


def wait_quiet(broker_pid: int | None, cores: float = 0.05, window_s: float = 0.3, limit_s: float = 20.0) -> None:
    """Until the broker is idle: noida-db rewrites its whole state file about every second, so a pass's data
    keeps it busy (~0.9 cores after 500,000 records) until its topics are deleted."""
    deadline, prev = time.monotonic() + limit_s, None
    while broker_pid and time.monotonic() < deadline:
        cur = group_cpu_seconds({"b": broker_pid})["b"]
        if prev is not None and (cur - prev) / window_s < cores:
            return
        prev = cur
        time.sleep(window_s)


def produce_inputs(bootstrap: str, names: Names, n_in: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": LINGER_MS})
    for i in range(n_in):
        producer.produce(names.input, VALUES[i % 64][:100], KEYS[i % 1000], partition=i % PARTITIONS)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(60):
        raise RuntimeError("input records not delivered")


def count_records(bootstrap: str, topics: tuple[str, ...], isolation: str, expected: int, limit_s: float = 60.0) -> int:
    """Records a fresh consumer with this isolation level reads from the topics' beginnings to their ends."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{uuid.uuid4().hex}",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "receive.message.max.bytes": RECEIVE_MESSAGE_MAX_BYTES})
    tps = [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)]
    ends = [consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in tps]
    consumer.assign([TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in tps])
    n, deadline = 0, time.monotonic() + limit_s
    while time.monotonic() < deadline:
        n += sum(1 for m in consumer.consume(10_000, 0.1) if not m.error())
        if n >= expected and all(tp.offset >= end for tp, end in zip(consumer.position(tps), ends, strict=True)):
            break
    consumer.close()
    return n


def committed_inputs(bootstrap: str, names: Names) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": names.group})
    tps = consumer.committed([TopicPartition(names.input, p) for p in range(PARTITIONS)], timeout=30)
    consumer.close()
    return sum(max(tp.offset, 0) for tp in tps)


def run_pass(bootstrap: str, tag: str, option: str, interval_ms: int, n_in: int, broker_pid=None,
             rate: float | None = None, profiler: cProfile.Profile | None = None) -> dict:
    wait_quiet(broker_pid)
    names = names_for(tag, f"{option}-{interval_ms}-{'paced' if rate else 'sat'}{'-prof' if profiler else ''}")
    create_topics(bootstrap, names)
    produce_inputs(bootstrap, names, n_in)
    txn = option.endswith("_txn")
    if profiler:
        profiler.enable()
    if option.startswith("confluent"):
        result = confluent_pass(bootstrap, names, n_in, interval_ms, txn, broker_pid, rate)
    else:
        result = asyncio.run(aiokafka_pass(bootstrap, names, n_in, interval_ms, txn, broker_pid, rate))
    if profiler:
        profiler.disable()
    else:
        n = result["records"]
        result = {"option": option, "interval_ms": interval_ms, "inputs": n_in, "inputs_per_s": rate, **result,
                  "read_committed": count_records(bootstrap, names.outputs, "read_committed", n),
                  "read_uncommitted": count_records(bootstrap, names.outputs, "read_uncommitted", n),
                  "offsets_committed": committed_inputs(bootstrap, names)}
    create_topics(bootstrap, names, delete=True)
    return result


def idle_consumers(bootstrap: str, tag: str, broker_pid: int | None, seconds: float = 2.0) -> dict:
    """Cores a consumer at the end of its log takes, and the broker meanwhile (why passes pause theirs)."""
    names, out = names_for(tag, "idle"), {}
    create_topics(bootstrap, names)
    produce_inputs(bootstrap, names, 100)
    broker = (lambda: group_cpu_seconds({"b": broker_pid})["b"]) if broker_pid else (lambda: 0.0)
    cores = lambda t0, b0: {"client_cores": round((time.process_time() - t0) / seconds, 2),  # noqa: E731
                            "broker_cores": round((broker() - b0) / seconds, 2) if broker_pid else None}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{names.group}-c", "auto.offset.reset": "earliest"})
    consumer.subscribe([names.input])
    seen = 0
    while seen < 100:
        seen += len(consumer.consume(1000, 0.5))
    start = (time.process_time(), broker())
    time.sleep(seconds)
    out["confluent"] = cores(*start)
    consumer.close()

    async def aiokafka_idle() -> None:
        from aiokafka import AIOKafkaConsumer
        consumer = AIOKafkaConsumer(names.input, bootstrap_servers=bootstrap, group_id=f"{names.group}-a",
                                    auto_offset_reset="earliest")
        await consumer.start()
        seen = 0
        while seen < 100:
            seen += sum(map(len, (await consumer.getmany(timeout_ms=500)).values()))
        start, end = (time.process_time(), broker()), time.monotonic() + seconds
        while time.monotonic() < end:
            await consumer.getmany(timeout_ms=200)
        out["aiokafka"] = cores(*start)
        await consumer.stop()

    asyncio.run(aiokafka_idle())
    create_topics(bootstrap, names, delete=True)
    return out


def run(bootstrap: str, records: int = DEFAULT_RECORDS, intervals_ms=DEFAULT_INTERVALS_MS,
        aiokafka_intervals_ms=DEFAULT_AIOKAFKA_INTERVALS_MS, paced_rate: float = DEFAULT_PACED_RATE,
        paced_s: float = DEFAULT_PACED_S, baseline_interval_ms: int = 100, profile: bool = True,
        broker_pid: int | None = None, progress: bool = True) -> dict:
    """Saturation passes (records/s, CPU) and paced passes (`paced_rate` inputs/s for `paced_s`: CPU and
    commit latency at a worker's rate) of every option, then the profiled paced passes of options 2 and 3."""
    from modpipe.output import progress_bar

    n_in = max(records // RECORDS_PER_INPUT, 1)
    n_paced = max(int(paced_rate * paced_s), 1)
    plan = ([(BASELINE, baseline_interval_ms)] + [("confluent_txn", i) for i in intervals_ms]
            + [("aiokafka_txn", i) for i in aiokafka_intervals_ms] + [("aiokafka_plain", baseline_interval_ms)])
    tag, out = uuid.uuid4().hex[:6], {"saturation": [], "paced": [], "profiles": {}}
    machine = CpuMeter({"broker": broker_pid} if broker_pid else {})  # what else ran meanwhile
    with progress_bar(total=2 * len(plan) + 1 + 2 * profile, desc="transport passes", unit="pass", enabled=progress) as bar:
        for kind, n, rate in (("saturation", n_in, None), ("paced", n_paced, paced_rate)):
            for option, interval in plan:
                bar.set_postfix_str(f"{kind} {option} {interval} ms")
                out[kind].append(run_pass(bootstrap, tag, option, interval, n, broker_pid, rate))
                bar.update(1)
        out["idle_consumers"] = idle_consumers(bootstrap, tag, broker_pid)
        bar.update(1)
        for option in ("confluent_txn", "aiokafka_txn") if profile else ():
            bar.set_postfix_str(f"{option} profiled")
            prof = cProfile.Profile(time.thread_time)
            res = run_pass(bootstrap, tag, option, baseline_interval_ms, max(n_paced // 2, 1), broker_pid, paced_rate,
                           prof)
            stats = pstats.Stats(prof).stats
            out["profiles"][f"{option}@{baseline_interval_ms}ms"] = {
                by: top_own_time(stats, res["records"], by) for by in ("function", "file")}
            bar.update(1)
    return {"records": n_in * RECORDS_PER_INPUT, "inputs": n_in, "paced_inputs_per_s": paced_rate,
            "workload": {"records_per_input": RECORDS_PER_INPUT, "value_bytes": VALUE_BYTES, "partitions": PARTITIONS,
                         "topics": OUT_TOPICS, "linger_ms": LINGER_MS, "baseline": BASELINE},
            "paced_records": n_paced * RECORDS_PER_INPUT, "cpus": os.cpu_count(),
            "saturation": add_ratios(out["saturation"]), "paced": add_ratios(out["paced"]),
            "profiles": out["profiles"], "idle_consumers": out["idle_consumers"], "machine": machine.stop(),
            "all_checks_ok": all(map(checks_ok, out["saturation"] + out["paced"]))}
