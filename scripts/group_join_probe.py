"""Probe: how often does the embedded broker leave a group join unanswered, and does joining again end it?

    .venv/bin/python scripts/group_join_probe.py [--trials 100] [--rejoin-after 10] [--static | --dynamic]

Each trial starts a fresh embedded broker (noida-db) with two 4-partition topics, and two consumers of one new
group join 0.3 s apart, configured like the workers' (range assignment, read_committed, session 10 s,
max.poll.interval.ms 15 min, static membership unless --dynamic); each assignment callback takes up to
--callback-s (a table restore). A trial has stalled when a member has had no assignment for --rejoin-after
seconds; with --rejoin-after > 0 that member then closes its consumer and subscribes with a new one, as
streams/kafka/consumer.py does (MODPIPE_GROUP_REJOIN_S). A trial fails when the group has not given the 8
partitions out between the two within --give-up seconds. Prints each stalled or failed trial and the counts.
Takes ~5 s a trial on 2 cores, plus the wait of each stall.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic
from tqdm import tqdm

from modpipe.services.broker import EmbeddedBroker
from modpipe.services.process import free_port

TOPICS, PARTITIONS = ("posts", "features.user"), 4


def member(conf: dict, name: str, args, report: dict, stop: threading.Event) -> None:
    """One group member: polls until `stop`, replaces its consumer after `args.rejoin_after` s unassigned."""
    assignments: list[int] = []  # partitions per assignment, negative per revocation
    conf = {**conf, "group.instance.id": f"{conf['group.id']}-{name}"} if args.static else conf

    def on_assign(consumer, partitions):
        time.sleep(random.uniform(0, args.callback_s))
        assignments.append(len(partitions))

    def on_revoke(consumer, partitions):
        assignments.append(-len(partitions))

    def subscribe() -> Consumer:
        consumer = Consumer({**conf, "isolation.level": "read_committed"})  # as the workers read
        consumer.subscribe(list(TOPICS), on_assign=on_assign, on_revoke=on_revoke)
        return consumer

    consumer, since = subscribe(), time.monotonic()
    report[name] = {"assignments": assignments, "stalled": 0}
    while not stop.is_set():
        consumer.poll(0.05)
        if not assignments and time.monotonic() - since > args.rejoin_after:
            report[name]["stalled"] += 1
            since = time.monotonic()
            if args.rejoin:
                consumer.close()
                consumer = subscribe()
    consumer.close()


def trial(index: int, args) -> dict:
    data_dir = Path(tempfile.mkdtemp(prefix="join-probe-")) / "data"
    data_dir.mkdir(parents=True)
    broker = EmbeddedBroker(data_dir, free_port(), log_path=data_dir.parent / "broker.log").start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "logger": _quiet})
        for future in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in TOPICS]).values():
            future.result(30)
        conf = {"bootstrap.servers": broker.bootstrap, "group.id": f"probe-{index}", "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 2_000, "max.poll.interval.ms": 900_000, "enable.auto.commit": False,
                "partition.assignment.strategy": "range", "logger": _quiet}
        report: dict = {}
        stop = threading.Event()
        threads = [threading.Thread(target=member, args=(conf, name, args, report, stop)) for name in ("a", "b")]
        started = time.monotonic()
        for t in threads:
            t.start()
            time.sleep(0.3)

        def settled() -> bool:  # both hold their last assignment and it covers every partition
            last = [r["assignments"][-1] for r in report.values() if r["assignments"]]
            return len(last) == 2 and min(last) > 0 and sum(last) == len(TOPICS) * PARTITIONS

        while not settled() and time.monotonic() - started < args.give_up:
            time.sleep(0.05)
        ok, took = settled(), time.monotonic() - started
        stop.set()
        for t in threads:
            t.join(30)
        return {"ok": ok, "seconds": round(took, 1), "stalled": sum(r["stalled"] for r in report.values())}
    finally:
        broker.stop()


class _Quiet:
    def log(self, *args, **kwargs) -> None:  # librdkafka's connection chatter as the broker stops
        pass


_quiet = _Quiet()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--rejoin-after", type=float, default=10.0,
                        help="seconds without an assignment that count as a stall (default 10)")
    parser.add_argument("--no-rejoin", dest="rejoin", action="store_false",
                        help="on a stall, keep waiting (what librdkafka alone does) instead of a new consumer")
    membership = parser.add_mutually_exclusive_group()
    membership.add_argument("--static", dest="static", action="store_true", default=True,
                            help="static membership, like the workers (default)")
    membership.add_argument("--dynamic", dest="static", action="store_false")
    parser.add_argument("--callback-s", type=float, default=2.0, help="assignment callback time, up to (default 2)")
    parser.add_argument("--give-up", type=float, default=40.0, help="seconds a trial may take (default 40)")
    args = parser.parse_args()
    stalled = failed = 0
    for i in tqdm(range(args.trials), unit="trial"):
        result = trial(i, args)
        stalled += result["stalled"] > 0
        failed += not result["ok"]
        if result["stalled"] or not result["ok"]:
            tqdm.write(f"trial {i}: {result}")
    membership_name = "static" if args.static else "dynamic"
    print(f"{args.trials} trials ({membership_name} membership, rejoin {'on' if args.rejoin else 'off'}): "
          f"{stalled} stalled past {args.rejoin_after:g} s, {failed} not settled within {args.give_up:g} s")


if __name__ == "__main__":
    main()
