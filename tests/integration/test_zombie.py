"""A zombie worker (issue #24): frozen (SIGSTOP, as a VM pause or a long GC would) for longer than its
session timeout while posts flow, while the group gives its partitions to the other worker; then woken
(SIGCONT). It must get nothing it writes after the freeze past a read_committed reader: its open transaction
is aborted, and it stops or rejoins the group. Its partitions' next owner processes their input again from the
committed offsets, so every post is decided, once; the supervisor restarts a worker that stopped.

On Apache Kafka (the default) the freeze guard is off (MODPIPE_FREEZE_GUARD): the group coordinator expires
the frozen member's session, and the woken zombie is stopped by Kafka's own fencing: librdkafka finds its
session expired and drops the partitions ("partitions lost"), or the broker refuses its checkpoint's offsets
as those of a member it no longer knows (KIP-447; tests/integration/test_generation_fencing.py shows that
refusal alone), or, frozen past transaction.timeout.ms, its producer is fenced. On the embedded broker (MODPIPE_BROKER=embedded) the guard is on: noida-db 0.2.3 never expires
the session of a member that stops heartbeating (measured: a consumer SIGSTOPped for 75 s with
session.timeout.ms 10 s kept its partitions), so the test does what Kafka's group coordinator does when the
session expires: it removes the frozen member from the group (a LeaveGroup request on its behalf, KIP-345's
"remove members", which the embedded broker serves), and the group rebalances without it.

To tell the decisions apart, the zombie's incarnation decides with the text-only decider (its decisions say
`model_versions.decider == "thresholds-v1"`); the other worker, and the zombie once restarted, with the
LightGBM engine. The freeze comes right after a burst of posts, while the zombie has rounds in flight (Triton
batches, records in its open transaction)."""

from __future__ import annotations

import contextlib
import json
import random
import signal
import socket
import struct
import threading
import time
from collections import Counter

import orjson
import pytest
from confluent_kafka import Producer
from modpipe.loadgen.chaos import read_all
from modpipe.loadgen.posts import make_post
from modpipe.streams.local.stack import LocalStack
from modpipe.streams.moderation.app import consumer_config, create_pipeline

from modpipe import schema
from modpipe.services.group_lag import uncommitted_input
from modpipe.settings import Settings
from tests.fixtures.waiting import wait_for

pytestmark = pytest.mark.integration

SESSION_S = 10.0  # streams/moderation/app.py consumer_config: session.timeout.ms
EMBEDDED = Settings.from_env().broker == "embedded"
# past the session timeout and the freeze guard's limit (session - heartbeat = 8 s); on Kafka the group waits
# out the session before it rebalances, so the other worker needs longer to take every partition over
FREEZE_S = SESSION_S + (6 if EMBEDDED else 14)
TAKEOVER_MAX_S = 60.0  # how long the zombie may stay frozen while the other worker takes its partitions over
RATE = 30  # posts per second while the zombie freezes and wakes
BURST = 150  # posts sent at once just before the freeze
# Frozen (checkpoint step 4, the guard), Runner.on_lost (librdkafka: session expired), and the broker's refusal
# of a checkpoint's offsets (KIP-447)
GUARD_REASON = "stood still"
# ... and, a freeze (24 s) past transaction.timeout.ms (20 s), the broker's abort of the frozen transaction: it bumps
# the producer's epoch, and the woken zombie's next transactional request is fenced (librdkafka: _FENCED)
KAFKA_REASONS = ("partitions lost", "UNKNOWN_MEMBER_ID", "ILLEGAL_GENERATION", "FENCED_INSTANCE_ID", "_FENCED",
                 "INVALID_PRODUCER_EPOCH")
FREEZE_REASONS = (GUARD_REASON, *KAFKA_REASONS)
MAX_RESTARTS = 2  # restarts after the zombie's own, by restart_stopped


ZOMBIE_DECIDER = "thresholds-v1"  # modpipe.decision.verdict.ThresholdDecider.version


class ZombieStack(LocalStack):
    """worker-0's first incarnation (the zombie) decides with the text-only decider."""

    zombie_started = False

    def worker_env(self, index: int) -> dict[str, str]:
        env = super().worker_env(index)
        if index == 0 and not self.zombie_started:
            env["MODPIPE_DECIDER"] = "text-only"
            self.zombie_started = True
        return env


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the broker closed the connection")
        data += chunk
    return data


def remove_member(bootstrap: str, group: str, instance_id: str) -> str:
    """Remove the member with `instance_id` (group.instance.id) from `group`, as the group coordinator does
    when a member's session expires: LeaveGroup v3 on its behalf (what Kafka's AdminClient
    removeMembersFromConsumerGroup sends; confluent-kafka has no call for it). Returns its member id."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group])[group].result(timeout=10)
    member = next(m for m in desc.members if m.group_instance_id == instance_id)

    def string(value: str | None) -> bytes:
        if value is None:
            return struct.pack(">h", -1)
        raw = value.encode()
        return struct.pack(">h", len(raw)) + raw

    # request header v1 (api key 13, version 3, correlation id, client id), then group_id, members[]
    request = (struct.pack(">hhi", 13, 3, 1) + string("modpipe-zombie-test") + string(group)
               + struct.pack(">i", 1) + string(member.member_id) + string(instance_id))
    with socket.create_connection((desc.coordinator.host, desc.coordinator.port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(request)) + request)
        response = _read_exactly(sock, struct.unpack(">i", _read_exactly(sock, 4))[0])
    _, _, error = struct.unpack(">iih", response[:10])  # correlation id, throttle_time_ms, error_code
    member_error = struct.unpack(">h", response[-2:])[0]  # the one member's error_code comes last
    assert error == 0 and member_error == 0, f"LeaveGroup failed: error {error}, member error {member_error}"
    return member.member_id


class Flow(threading.Thread):
    """Posts at RATE per second (idempotent producer: the input holds each post once) until stopped."""

    def __init__(self, settings, bootstrap: str, texts: list[dict]):
        super().__init__(name="zombie-posts", daemon=True)
        self.settings, self.texts = settings, texts
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        self.sent: set[str] = set()
        self.halt = threading.Event()
        self.burst = threading.Event()
        self.rng = random.Random(24)
        self.i = 0

    def send(self) -> None:
        item = self.texts[self.i % len(self.texts)]
        post = make_post(self.rng, f"zombie-{self.i}", item["text"], user_id=f"user-{self.i % 37}")
        self.producer.produce(self.settings.topic("posts"), key=post["user_id"].encode(), value=schema.dumps(post))
        self.sent.add(post["post_id"])
        self.producer.poll(0)
        self.i += 1

    def run(self) -> None:
        start, paced = time.monotonic(), 0
        while not self.halt.is_set():
            if self.burst.is_set():  # BURST posts at once
                for _ in range(BURST):
                    self.send()
                self.producer.flush(10)
                self.burst.clear()
            self.send()
            paced += 1
            time.sleep(max(0.0, start + paced / RATE - time.monotonic()))

    def stop(self) -> set[str]:
        self.halt.set()
        self.join(10)
        assert self.producer.flush(30) == 0
        return self.sent


def decided(settings, bootstrap: str, topic: str) -> set[str]:
    """post_ids decided so far, as a read_committed reader of the whole topic sees them."""
    return {orjson.loads(m.value())["post_id"] for m in read_all(settings, bootstrap, [topic])}


def assigned(stack: LocalStack, index: int) -> int:
    return int(sum(v for k, v in stack.scrape_worker(stack.workers[index]).items()
                   if k.startswith("modpipe_assigned_partitions")))


def stage_duplicates(settings, bootstrap: str, topics: list[str]) -> Counter:
    """Items seen more than once in the stage topics by a read_committed reader: a post's hop to a stage, or
    a decision's feedback (post_id, revision) to it."""
    seen: Counter = Counter()
    for m in read_all(settings, bootstrap, topics):
        for item in orjson.loads(m.value())["items"]:
            ctx = item.get("ctx") or {}
            seen[(m.topic(), item.get("kind"), ctx.get("post_id"), ctx.get("revision"),
                  orjson.dumps(item.get("to")))] += 1
    return Counter({k: n for k, n in seen.items() if n > 1})


def restart_stopped(stack: LocalStack, restarts: list[dict]) -> bool:
    """What the supervisor does while the group settles: restart a worker that stopped because it lost its
    partitions. On the embedded broker, a worker restarted after the zombie stopped was once removed from
    the group 1.4 s after it got its partitions (the other worker was handed all of them first), while the
    rebalance begun by the zombie's last join was still settling; it stopped on `Runner.on_lost`, as it
    should, and with nobody to restart it its partitions stood still. A worker stopped for any other
    reason, or stopped again and again, fails the test. Returns True, for use inside `wait_for`."""
    for i, w in enumerate(stack.workers):
        if w.process.alive():
            continue
        log = w.process.tail(30)
        assert w.process.proc.returncode == 1 and any(r in log for r in FREEZE_REASONS), {"worker": w.name, "log": log}
        assert len(restarts) < MAX_RESTARTS, {"restarts": restarts, "log": log}
        restarts.append({"worker": w.name, "reason": next(r for r in FREEZE_REASONS if r in log)})
        stack.start_worker(i)
        stack.wait_workers_ready()
    return True


def test_a_worker_frozen_past_its_session_gets_nothing_past_a_read_committed_reader(pipeline_settings, model_build):
    settings = pipeline_settings
    # no purge: the check below reads the stage topics whole, committed and aborted records alike
    stack = ZombieStack(settings, workers=2, extra_env={"MODPIPE_PURGE_INTERVAL_MS": "0"})
    t0 = time.monotonic()
    frozen = False
    flow = None
    try:
        stack.start()
        zombie = stack.workers[0]
        wanted = len(stack.topics.inputs()) * settings.partitions
        # both have partitions (the group may still be settling its last rebalance)
        wait_for(lambda: assigned(stack, 0) and assigned(stack, 1) and
                 assigned(stack, 0) + assigned(stack, 1) == wanted, 60, "partitions split between the workers")
        topic = stack.topics.decisions
        flow = Flow(settings, stack.bootstrap, model_build.heldout())
        flow.start()
        wait_for(lambda: len(decided(settings, stack.bootstrap, topic)) >= 60, 60, "decisions before the freeze")
        zombie_had = assigned(stack, 0)
        flow.burst.set()
        wait_for(lambda: not flow.burst.is_set(), 10, "the burst sent", interval=0.01)
        time.sleep(0.3)  # the zombie has fetched some of it: rounds in flight
        decided_before = len(decided(settings, stack.bootstrap, topic))

        zombie.process.signal(signal.SIGSTOP)
        frozen = True
        stopped_ms = int(time.time() * 1000)
        stopped = time.monotonic()
        if EMBEDDED:  # what the session's expiry does on Kafka
            instance = consumer_config(settings, stack.bootstrap, zombie.name)["group.instance.id"]
            remove_member(stack.bootstrap, settings.app_id, instance)
        # the zombie stays frozen until the other worker holds every partition (on a loaded machine its
        # revocation's checkpoint waits longer for the rounds in flight), and FREEZE_S at least
        wait_for(lambda: assigned(stack, 1) == wanted, TAKEOVER_MAX_S, "the other worker given every partition")
        takeover_s = time.monotonic() - stopped
        time.sleep(max(0.0, stopped + FREEZE_S - time.monotonic()))
        during = len(decided(settings, stack.bootstrap, topic)) - decided_before
        zombie.process.signal(signal.SIGCONT)
        frozen = False
        woke_ms = int(time.time() * 1000)

        time.sleep(3)  # posts keep coming for a while after the zombie woke
        sent = flow.stop()
        # the zombie stops (exit 1), or rejoins the group: then the two split the partitions again
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not zombie.process.alive(), 20, "the zombie stopped")
        returncode = zombie.process.proc.returncode
        log = zombie.process.log_path.read_text(errors="replace")
        reasons = [line for line in log.splitlines() if any(r in line for r in FREEZE_REASONS)]
        if zombie.process.alive():
            outcome = wait_for(lambda: assigned(stack, 0) and assigned(stack, 0) + assigned(stack, 1) == wanted
                               and "rejoined", 30, "the zombie, still running, rejoined the group")
        else:
            outcome = "exited"
            assert returncode == 1 and reasons, {"returncode": returncode, "log": zombie.process.tail(30)}
            stack.start_worker(0)  # what the supervisor does (`LocalStack.supervise`); with the text model now
            stack.wait_workers_ready()
        restarts: list[dict] = []
        with contextlib.suppress(AssertionError):  # judged below, from what the broker holds
            wait_for(lambda: restart_stopped(stack, restarts) and sent <= decided(settings, stack.bootstrap, topic),
                     90, "every post decided", 1.0)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: restart_stopped(stack, restarts)
                     and uncommitted_input(settings, stack.bootstrap, stack.topics.inputs()) == 0, 30,
                     "every input record committed by the group")
        behind: dict = {}
        uncommitted = uncommitted_input(settings, stack.bootstrap, stack.topics.inputs(), per_partition=behind)
        assert all(w.process.alive() for w in stack.workers), [w.process.tail(20) for w in stack.workers]
        for w in stack.workers:  # what they hold is committed; stopped, nothing changes under the reads
            w.stop()

        committed = [(m, orjson.loads(m.value()))
                     for m in read_all(settings, stack.bootstrap, [stack.topics.decisions])]
        at_least_once = [(m, orjson.loads(m.value()))
                         for m in read_all(settings, stack.bootstrap, [stack.topics.decisions], "read_uncommitted")]
        per_key = Counter((d["post_id"], d["revision"]) for _, d in committed)
        twice = {k: n for k, n in per_key.items() if n > 1}
        by_zombie = [(m, d) for m, d in committed if d["model_versions"]["decider"] == ZOMBIE_DECIDER]
        # A record's timestamp is when its producer took it; the zombie took none while frozen.
        late = [d["post_id"] for m, d in by_zombie if m.timestamp()[1] >= stopped_ms]
        zombie_wrote = [(m, d) for m, d in at_least_once if d["model_versions"]["decider"] == ZOMBIE_DECIDER]
        aborted_zombie = len(zombie_wrote) - len(by_zombie)
        zombie_wrote_late = sum(m.timestamp()[1] >= stopped_ms for m, _ in zombie_wrote)
        stages = stage_duplicates(settings, stack.bootstrap, list(stack.topics.stages.values()))
        outputs = [*stack.topics.stages.values(), *(t.changelog for t in create_pipeline(settings).tables.values())]
        aborted_outputs = (sum(1 for _ in read_all(settings, stack.bootstrap, outputs, "read_uncommitted"))
                           - sum(1 for _ in read_all(settings, stack.bootstrap, outputs)))
        missing = sorted(sent - {d["post_id"] for _, d in committed})
        report = {"sent": len(sent), "decided": len({d["post_id"] for _, d in committed} & sent),
                  "missing": len(missing), "missing_examples": missing[:5], "uncommitted_input": behind,
                  "committed_records": len(committed), "at_least_once_records": len(at_least_once),
                  "aborted": len(at_least_once) - len(committed), "aborted_by_zombie": aborted_zombie,
                  "aborted_stage_and_changelog_records": aborted_outputs,
                  "duplicates": len(twice), "stage_duplicates": len(stages),
                  "zombie_committed": len(by_zombie), "zombie_wrote_after_freeze": zombie_wrote_late,
                  "zombie_committed_after_freeze": len(late),
                  "zombie_partitions_before": zombie_had, "takeover_s": round(takeover_s, 1),
                  "decided_during_freeze": during, "outcome": outcome, "zombie_returncode": returncode,
                  "zombie_woke_after_s": round((woke_ms - stopped_ms) / 1000, 1),
                  "seconds": round(time.monotonic() - t0, 1),
                  "zombie_reason": reasons[-1][:300] if reasons else None, "restarts_after_wake": restarts}
        print("zombie report:", json.dumps(report))
        assert not missing, report  # every post decided, as a read_committed reader sees the decisions
        assert uncommitted == 0, report  # and every input record committed
        assert not twice, {**report, "examples": list(twice)[:5]}
        assert not stages, {**report, "examples": [str(k) for k in list(stages)[:3]]}
        assert not late, {**report, "examples": late[:5]}  # nothing it wrote after the freeze was committed
        assert len(at_least_once) >= len(committed), report
        if not EMBEDDED:  # the guard is off: what stopped the zombie was Kafka's fencing, never the guard
            assert not any(GUARD_REASON in line for line in reasons), report
    finally:
        if frozen:
            stack.workers[0].process.signal(signal.SIGCONT)
        if flow is not None and flow.is_alive():
            flow.halt.set()
        stack.stop()
