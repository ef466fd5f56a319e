"""Probe: what a paced reader costs on the embedded broker, by how its fetch window ends.

    .venv/bin/python scripts/fetch_window_probe.py [--partitions 40] [--seconds 12] [--rate 5] [--busy]

Starts its own noida-db, assigns one reader (read_committed, `fetching.paced_fetches`) to every partition of
10 topics, and measures side by side, one mode after the other:
- `timer`: the window ends at its first records or after 3 ms (what readers did before the answer-ended
  window; without end-of-partition events there is nothing else to end it on);
- `answer`: the window ends once every partition has answered (records or an end-of-partition event,
  `fetching.PACED_CONSUMER_CONFIG`), or after `fetching.FETCH_WAIT_S`.
For each, the reader's process and the broker's CPU while idle (cores, from /proc), and the latency from
produce() to the reader seeing the record for `--rate` records/s of Poisson arrivals. `--busy` runs the same
with two spinning processes on the machine's cores (a loaded machine: the answer may come late).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from modpipe.services import fetching
from modpipe.services.broker import broker_binary


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(bootstrap: str, broker_pid: int, mode: str, topics: list[str], partitions: int, pause_s: float,
            seconds: float, rate: float) -> str:
    answer = mode == "answer"
    saved = fetching.FETCH_WAIT_S
    fetching.FETCH_WAIT_S = saved if answer else 0.003
    conf = {"bootstrap.servers": bootstrap, "group.id": f"probe-{time.time()}", "isolation.level": "read_committed",
            "auto.offset.reset": "latest", "enable.auto.commit": False, "fetch.wait.max.ms": 100,
            **(fetching.PACED_CONSUMER_CONFIG if answer else {})}
    consumer = Consumer(conf)
    consumer.assign([TopicPartition(t, p) for t in topics for p in range(partitions)])
    stop, seen = threading.Event(), []

    def read() -> None:
        for messages in fetching.paced_fetches(consumer, stop, pause_s, grace_s=0.5):
            now = time.time()
            seen.extend(now - float(m.value().decode()) for m in messages)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        time.sleep(2.0)
        me, broker, t0 = cpu_s(os.getpid()), cpu_s(broker_pid), time.monotonic()
        time.sleep(seconds)
        wall = time.monotonic() - t0
        idle = ((cpu_s(os.getpid()) - me) / wall, (cpu_s(broker_pid) - broker) / wall)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        for i in range(int(seconds * rate)):
            time.sleep(random.expovariate(rate))
            producer.produce(topics[0], str(time.time()).encode(), partition=i % partitions)
            producer.poll(0)
        producer.flush()
        time.sleep(0.5)
    finally:
        stop.set()
        reader.join()
        consumer.close()
        fetching.FETCH_WAIT_S = saved
    lat = sorted(x * 1000 for x in seen)
    q = lambda f: lat[min(len(lat) - 1, int(f * len(lat)))] if lat else float("nan")  # noqa: E731
    return (f"{mode:6s} idle: reader {idle[0]:.3f} cores, broker {idle[1]:.3f} cores | "
            f"{len(lat)} records: p50 {q(0.5):.1f} ms, p99 {q(0.99):.1f} ms")


def spin() -> None:
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=4, help="partitions per topic (10 topics)")
    ap.add_argument("--seconds", type=float, default=12.0, help="idle seconds measured, and seconds of records")
    ap.add_argument("--rate", type=float, default=5.0, help="records per second in the latency part")
    ap.add_argument("--pause-ms", type=float, default=20.0, help="the pause between windows")
    ap.add_argument("--busy", action="store_true", help="also run with two spinning processes")
    args = ap.parse_args()
    data = tempfile.mkdtemp(prefix="fetch-probe-")
    port = random.randint(30000, 40000)
    broker = subprocess.Popen([str(broker_binary()), "start", "--only", "kafka", "--kafka-port", str(port),
                               "--host", "127.0.0.1", "--data-dir", data],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        bootstrap = f"127.0.0.1:{port}"
        topics = [f"probe{i}" for i in range(10)]
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(t, args.partitions, 1) for t in topics]).values():
            future.result()
        loads = [False, True] if args.busy else [False]
        for busy in loads:
            spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(2 if busy else 0)]
            for s in spinners:
                s.start()
            print("two spinning processes on the cores" if busy else "quiet machine", flush=True)
            for mode in ("timer", "answer", "timer", "answer"):
                print(" ", measure(bootstrap, broker.pid, mode, topics, args.partitions, args.pause_ms / 1000,
                                   args.seconds, args.rate), flush=True)
            for s in spinners:
                s.terminate()
    finally:
        broker.kill()
        broker.wait()


if __name__ == "__main__":
    main()
