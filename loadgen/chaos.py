"""`modpipe chaos`: simulated traffic through the local stack while its processes are killed.

    modpipe chaos --posts 10000 --rate 60 --workers 3 --brokers 3 --worker-kills 5 --triton-kills 2 \
        --leader-kills 1 --txn-coordinator-kills 1 --group-coordinator-kills 1

Workers, Triton and broker nodes are SIGKILLed at seeded times spread over the traffic (`fault_plan`); the
stack's supervisor (`LocalStack.supervise`, what `modpipe up` runs) restarts each with its backoff.
`--triton-outage S` keeps Triton down S seconds after each of its kills (an outage): the report gives, per
outage, the decisions made without the text model meanwhile and how soon after Triton is ready again decisions
with it resume (`outage_summary`).

On Apache Kafka (the default broker; `--brokers 3` runs three KRaft nodes with replication 3 and
min.insync.replicas 2) the broker faults are SIGKILLs of one node, chosen by what it does at that moment:
`leader` the node that leads the most `posts` partitions, `txn-coordinator` the transaction coordinator of a
worker's current transactional id, `group-coordinator` the coordinator of the workers' consumer group, and
`broker` any node (seeded). A killed node loses nothing it acknowledged with acks=all: the other replicas hold
it, and a one-node cluster's log files survive a SIGKILL.

The embedded broker (MODPIPE_BROKER=embedded) saves its data about once a second and loses what it
acknowledged since then when it is killed, and even when it is stopped while clients write (measured: ~60 of
4,500 records written in the last second before a SIGKILL; 9 of 2,000 posts, with decisions and changelog
records, over one SIGTERM under load). No client can make up for a broker that forgets what it acknowledged.
So there the broker restart is a clean one by default (`Injector`: traffic held and workers frozen until the
broker has saved, then SIGTERM; the workers go on at once and see the broker go and come back);
`--broker-signal kill` SIGKILLs it under load instead, and what it lost is counted apart (`lost_by_broker`),
the comparisons using what the broker still holds.

Once the traffic is over and the stack has settled, the run reads back, from the broker itself:

- the whole `decisions` topic as a `read_committed` consumer reads it (what the platform acts on: the
  workers write in Kafka transactions, streams/checkpointing/checkpoint.py): posts sent / decided / lost, duplicate
  decisions (same post_id and revision seen twice; exactly-once processing makes them 0), degraded decisions
  and their re-decisions; and read again `read_uncommitted`, the records an at-least-once reader would have
  seen beyond the committed ones (`aborted_decisions`: the outputs of transactions that a killed or fenced
  worker never committed, whose input was processed again) and the duplicates it would have counted;
- every feature table's changelog (the tables' durable state, what a restarted worker recovers from), last
  value per key, compared with `modpipe.features.offline` over the same events and the decisions the pipeline
  published (`compare_tables`).

Why the final state and not each decision's features: feedback (decisions, labels) reaches the tables
concurrently with posts, so the features one post saw depend on timing even without faults. The states are
built to be order-independent (counts keyed by event id, marks that keep a maximum), so the final state is
exact whatever the timing: a double-counted replay or a lost update shows up there as a wrong count.
The post table's decision snapshots (the features a decision was made from, timing-dependent) are left out.

The pure parts (plan, decision accounting, state comparison) are unit-tested without a broker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import orjson
from modpipe.features.events import TABLES

from modpipe import log
from modpipe.services.group_lag import end_offsets
from modpipe.settings import Settings

_log = log.get(__name__)

# broker node faults by role (Apache Kafka): what `Injector` looks up to choose the node it kills
NODE_FAULTS = ("leader", "txn-coordinator", "group-coordinator")
FAULT_KINDS = ("worker", "triton", "broker", *NODE_FAULTS, "join")
# decision gaps around a worker joining: the window each partition's decisions are looked at in
JOIN_BEFORE_S, JOIN_AFTER_S = 5.0, 30.0


@dataclasses.dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the first post
    kind: str  # one of FAULT_KINDS
    worker: int | None = None  # which worker, for kind == worker (and whose transactional id, txn-coordinator);
    # for kind == join, the index of the worker that joins (one more than the workers so far)


def fault_plan(duration_s: float, *, worker_kills: int, triton_kills: int, broker_restarts: int, workers: int,
               seed: int, start: float = 0.1, end: float = 0.8, leader_kills: int = 0,
               txn_coordinator_kills: int = 0, group_coordinator_kills: int = 0, worker_joins: int = 0,
               triton_outage_s: float = 0.0) -> list[Fault]:
    """Kills at seeded times between `start` and `end` of the traffic's duration: the window is cut into one
    slot per fault and each fault falls somewhere in the middle of its slot, so that two faults are never on
    top of each other (each restart is seen through) while the order of kinds is random. A join starts one more
    worker (a scale-out step): kills pick among the workers there from the start. A Triton kill with an
    outage of `triton_outage_s` comes early enough for the outage to end by `end` (not before `start`): decisions
    resuming under traffic is what an outage is run for."""
    kinds = (["worker"] * worker_kills + ["triton"] * triton_kills + ["broker"] * broker_restarts
             + ["leader"] * leader_kills + ["txn-coordinator"] * txn_coordinator_kills
             + ["group-coordinator"] * group_coordinator_kills + ["join"] * worker_joins)
    if not kinds:
        return []
    if workers < 1:
        raise ValueError("workers must be >= 1")
    rng = random.Random(seed)
    rng.shuffle(kinds)
    slot = (end - start) * duration_s / len(kinds)
    plan, joined = [], 0
    for i, kind in enumerate(kinds):
        at = round(start * duration_s + slot * (i + rng.uniform(0.25, 0.75)), 2)
        if kind == "join":
            plan.append(Fault(at, kind, workers + joined))
            joined += 1
        else:
            if kind == "triton" and triton_outage_s:
                at = round(max(start * duration_s, min(at, end * duration_s - triton_outage_s)), 2)
            plan.append(Fault(at, kind, rng.randrange(workers) if kind in ("worker", "txn-coordinator") else None))
    return sorted(plan, key=lambda f: f.at_s)


def assignments(log_lines: Iterable[str], topic: str) -> list[tuple[float, list[int]]]:
    """(wall-clock seconds, the partitions of `topic`) of each `partitions assigned` line of a worker's log: when
    its partitions' tables were all in."""
    out = []
    for line in log_lines:
        if '"partitions assigned"' not in line:
            continue
        with contextlib.suppress(ValueError, KeyError, TypeError):
            record = orjson.loads(line)
            if record["msg"] == "partitions assigned":
                out.append((_wall_s(record["ts"]), sorted(record["topic_partitions"].get(topic, []))))
    return out


def _wall_s(rfc3339: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def decision_gaps(decided: Iterable[tuple[int, float]], joined_at: float, partitions: int,
                  owners_before: dict[int, str], owners_after: dict[int, str], before_s: float = JOIN_BEFORE_S,
                  after_s: float = JOIN_AFTER_S) -> dict:
    """How long each `posts` partition went without a decision around a worker joining at `joined_at`
    (wall-clock s): per partition the longest gap between two decisions (by `decided_at`) of its posts, from
    `before_s` before the join to `after_s` after it (the window's edges count as decisions: a partition that
    stopped at the end of the window is not missed). A partition kept its worker when its owner before the join
    (the last assignment) is its owner after it; the others moved. Seconds; p50 and max per group."""
    lo, hi = joined_at - before_s, joined_at + after_s
    times: dict[int, list[float]] = {p: [lo, hi] for p in range(partitions)}
    for partition, at in decided:
        if lo < at < hi:
            times[partition].append(at)
    gaps = {}
    for p, ts in times.items():
        ts.sort()
        gaps[p] = round(max(b - a for a, b in zip(ts, ts[1:], strict=False)), 2)
    kept = sorted(p for p in gaps if p in owners_before and owners_before.get(p) == owners_after.get(p))
    moved = sorted(p for p in gaps if p not in kept)

    def summary(ps: list[int]) -> dict:
        values = sorted(gaps[p] for p in ps)
        return {"partitions": len(ps), "p50_s": values[(len(values) - 1) // 2] if values else None,
                "max_s": values[-1] if values else None}

    return {"gap_s": {str(p): g for p, g in sorted(gaps.items())}, "kept": summary(kept), "moved": summary(moved),
            "window_s": [before_s, after_s]}


def outage_summary(killed_wall_s: float, back_wall_s: float | None, decisions: Iterable[dict]) -> dict:
    """One Triton outage, from Triton's kill to the moment it was ready again (wall-clock s; None: not back
    before the run ended): the decisions made meanwhile without the text model (degraded) and with it (none
    expected), and the seconds from its return to the first decision made with the text model
    (`resumed_after_s`; None: none was)."""
    end = back_wall_s if back_wall_s is not None else float("inf")
    degraded = with_model = 0
    first_after = None
    for d in decisions:
        if not d.get("decided_at"):
            continue
        at = _wall_s(d["decided_at"])
        if killed_wall_s <= at < end:
            if d.get("degraded"):
                degraded += 1
            else:
                with_model += 1
        elif at >= end and not d.get("degraded") and (first_after is None or at < first_after):
            first_after = at
    return {"down_s": round(end - killed_wall_s, 1) if back_wall_s is not None else None,
            "decided_degraded_during": degraded, "decided_with_the_model_during": with_model,
            "resumed_after_s": round(first_after - back_wall_s, 2) if first_after is not None and back_wall_s else None}


def count_decisions(records: Iterable[dict], sent: Iterable[str]) -> dict:
    """Decision accounting over every decision record of the run (any order).

    lost: sent posts without a decision; duplicates: records beyond the first of a (post_id, revision);
    degraded: posts with a degraded decision, and how many of them were decided again without it."""
    sent = set(sent)
    per_key: Counter = Counter()
    verdicts: dict[tuple[str, int], set] = {}
    degraded: set[str] = set()
    undegraded_after: dict[str, int] = {}  # post -> highest revision decided with the text model
    degraded_rev: dict[str, int] = {}
    for d in records:
        pid, rev = d["post_id"], int(d.get("revision") or 1)
        per_key[(pid, rev)] += 1
        verdicts.setdefault((pid, rev), set()).add(d.get("verdict"))
        if d.get("degraded"):
            degraded.add(pid)
            degraded_rev[pid] = max(degraded_rev.get(pid, 0), rev)
        else:
            undegraded_after[pid] = max(undegraded_after.get(pid, 0), rev)
    decided = {pid for pid, _ in per_key}
    duplicate_keys = {k: n for k, n in per_key.items() if n > 1}
    redecided = {p for p in degraded if undegraded_after.get(p, 0) > degraded_rev[p]}
    return {
        "sent": len(sent), "decided": len(decided & sent), "lost": len(sent - decided),
        "unexpected": len(decided - sent),  # decisions for posts this run never sent
        "decision_records": sum(per_key.values()),
        "duplicate_decisions": sum(n - 1 for n in duplicate_keys.values()),
        "posts_with_duplicates": len({pid for pid, _ in duplicate_keys}),
        # a replay decides a post again from the features of that moment: the verdict may differ (the last
        # record of a post_id, in its partition's order, is the one that stands)
        "duplicates_with_another_verdict": sum(len(v) > 1 for v in verdicts.values()),
        "revisions": dict(sorted(Counter(rev for _, rev in per_key).items())),
        "degraded_posts": len(degraded), "degraded_redecided": len(redecided),
        "degraded_not_redecided": len(degraded - redecided),
        "examples": {"lost": sorted(sent - decided)[:5],
                     "duplicates": [f"{p}@{r}" for p, r in sorted(duplicate_keys)[:5]]},
    }


def canonical(table: str, state: dict) -> dict:
    """A table value without what depends on arrival order or timing (see the module docstring): the post
    table's decision snapshot, and its `ban` mark (set when a domain ban reaches the domain table after the
    post did, to decide it again; a post that arrives after the ban is decided with the ban already known and
    is not marked, and which came first at the domain table is timing); lists kept in arrival order (a
    domain's recent posts and applied bans, a post's pending events) compared as sets."""
    out = dict(state)
    if table == "post":
        out.pop("snapshot", None)
        out.pop("ban", None)
        out["pending"] = sorted(orjson.dumps(p).decode() for p in out.get("pending") or [])
    elif table == "domain":
        out["recent"] = sorted(map(tuple, out.get("recent") or []))
        out["bans"] = sorted(map(tuple, out.get("bans") or []))
    return out


def compare_tables(streaming: dict[str, dict[str, dict]], offline: dict[str, dict[str, dict]],
                   tables: Iterable[str] = TABLES, examples: int = 3) -> dict:
    """Per table: keys in both, keys only on one side, keys whose canonical values differ (with a few field
    level examples). `equal` is True when nothing differs anywhere."""
    report: dict = {"tables": {}, "examples": []}
    for table in tables:
        s, o = streaming.get(table, {}), offline.get(table, {})
        differ = []
        for key in s.keys() & o.keys():
            a, b = canonical(table, s[key]), canonical(table, o[key])
            if a != b:
                differ.append(key)
                if len(report["examples"]) < examples:
                    fields = sorted(f for f in a.keys() | b.keys() if a.get(f) != b.get(f))
                    report["examples"].append({"table": table, "key": key, "fields": fields,
                                               "streaming": {f: a.get(f) for f in fields},
                                               "offline": {f: b.get(f) for f in fields}})
        report["tables"][table] = {"keys": len(s.keys() & o.keys()), "only_streaming": len(s.keys() - o.keys()),
                                   "only_offline": len(o.keys() - s.keys()), "differ": len(differ)}
    report["equal"] = all(not (t["only_streaming"] or t["only_offline"] or t["differ"])
                          for t in report["tables"].values())
    return report


def offline_tables(events: Iterable[tuple[str, dict]], decisions: Iterable[dict], posts: dict[str, dict]) -> dict:
    """modpipe.features.offline's tables over the run's events, then every decision the pipeline published (their
    order does not matter to the states they update: see the module docstring)."""
    from modpipe.features.events import PREPARE
    from modpipe.features.offline import DictStore, apply_event, prepare_decision_event

    store = DictStore()
    for kind, raw in events:
        apply_event(kind, PREPARE[kind](raw), store)
    for d in decisions:  # every copy: a replay may decide a post again differently, and the tables got each
        post = posts.get(d["post_id"])
        if post is None:
            continue
        raw = {"post_id": post["post_id"], "user_id": post.get("user_id"), "ip": post.get("ip"),
               "created_at": post.get("created_at"), "spam": d["verdict"] == "block",
               "revision": int(d.get("revision") or 1)}
        apply_event("decision", prepare_decision_event(raw), store)
    return orjson.loads(orjson.dumps(store.dump()))  # the JSON a changelog holds: lists, not tuples


# --------------------------------------------------------------------------- reading back from the broker


def read_all(settings: Settings, bootstrap: str, topics: list[str], isolation: str = "read_committed",
             timeout_s: float = 120.0) -> Iterator:
    """Every record now in `topics` that a consumer with `isolation` is given, from the log start to the end
    offsets read at the start (for `read_committed` the last stable offset: an open transaction's records are
    left out). A partition is done when the consumer's position reaches its end, not when a record at the end
    arrives: a topic written in transactions ends with a commit or abort marker, which no reader is given, and
    a `read_committed` reader is given no aborted record either."""
    from modpipe.services.readback import read_to_end

    if isolation not in ("read_committed", "read_uncommitted"):
        raise ValueError(f"isolation must be read_committed or read_uncommitted, not {isolation!r}")
    return read_to_end(settings, bootstrap, topics, timeout_s, isolation=isolation)


def changelog_topic(settings: Settings, table: str) -> str:
    """The changelog a table's states are written to (`<app id>-features-<table>-changelog`), by
    streams/state/tables.py's own naming."""
    from modpipe.streams.state import tables

    return tables.changelog_topic(settings.app_id, table)


def streaming_tables(settings: Settings, bootstrap: str) -> dict[str, dict[str, dict]]:
    """Each feature table's last value per key, as its changelog holds it (committed states only)."""
    topic_table = {changelog_topic(settings, t): t for t in TABLES}
    out: dict[str, dict[str, dict]] = {t: {} for t in TABLES}
    for msg in read_all(settings, bootstrap, list(topic_table)):
        key = orjson.loads(msg.key())
        if msg.value() is None:
            out[topic_table[msg.topic()]].pop(key, None)
        else:
            out[topic_table[msg.topic()]][key] = orjson.loads(msg.value())
    return out


def input_events(settings: Settings, bootstrap: str, topics: dict[str, str]) -> list[tuple[str, dict]]:
    """(kind, payload) of every record in the input topics ({kind: topic}), in record-time order: what the
    broker holds, which is what the pipeline could process (a broker may lose records it acknowledged)."""
    kind_of = {topic: kind for kind, topic in topics.items()}
    rows = [(m.timestamp()[1], m.topic(), m.partition(), m.offset(), orjson.loads(m.value()))
            for m in read_all(settings, bootstrap, list(kind_of))]
    rows.sort(key=lambda r: r[:4])
    return [(kind_of[topic], payload) for _, topic, _, _, payload in rows]


def watermarks(settings: Settings, bootstrap: str, topics: list[str]) -> int:
    """Sum of the high watermarks of `topics`: changes while anything is still being produced."""
    return sum(end_offsets(settings, bootstrap, topics).values())


def held_back(settings: Settings, bootstrap: str, topics: list[str]) -> dict[str, list[int]]:
    """Partitions whose last stable offset is behind their high watermark, as `{"topic:p": [stable, high]}`:
    a transaction still open there holds every `read_committed` reader (the next stage, the group's
    commits, this run's checks) at its first record. Settled, none is."""
    stable = end_offsets(settings, bootstrap, topics, "read_committed")
    high = end_offsets(settings, bootstrap, topics)
    return {f"{t}:{p}": [at, high[(t, p)]] for (t, p), at in stable.items() if at < high[(t, p)]}


# --------------------------------------------------------------------------- the run


def run_chaos(settings: Settings, *, posts: int, rate: float, workers: int = 2, worker_kills: int = 5,
              triton_kills: int = 2, broker_restarts: int = 1, seed: int = 0, scenario: str = "mixed",
              timeout_s: float = 600.0, quiet_s: float = 15.0, check_features: bool = True, progress: bool = True,
              keep_state: bool = False, broker_signal: str = "term", brokers: int | None = None,
              leader_kills: int = 0, txn_coordinator_kills: int = 0, group_coordinator_kills: int = 0,
              worker_joins: int = 0, triton_outage_s: float = 0.0) -> dict:
    """Run the traffic and the faults on an isolated local stack; returns the report."""
    import shutil

    from modpipe.loadgen.bench.runs import isolated_settings
    from modpipe.loadgen.measure import DecisionCollector
    from modpipe.loadgen.smoke import end_consumer
    from modpipe.loadgen.traffic import (
        ProduceStats,
        arrival_times,
        ensure_loadgen_topics,
        make_producer,
        produce_events,
    )
    from modpipe.simulation.simulator import Simulation
    from modpipe.streams.local.stack import LocalStack, dump_stacks

    from modpipe.output import progress_bar
    from modpipe.textmodel.artifacts import resolve_model

    if settings.bootstrap_servers or settings.triton_url:
        raise ValueError("chaos kills the processes of the local stack: unset KAFKA_BOOTSTRAP_SERVERS and TRITON_URL")
    node_faults = leader_kills + txn_coordinator_kills + group_coordinator_kills
    if settings.broker == "embedded" and (node_faults or (brokers or 1) > 1):
        raise ValueError("--brokers and the leader / coordinator kills need Apache Kafka (MODPIPE_BROKER=kafka)")
    if brokers:
        settings = dataclasses.replace(settings, kafka_nodes=brokers)
    if broker_signal not in ("term", "kill"):
        raise ValueError("broker_signal must be term or kill")
    if posts < 1 or rate <= 0:
        raise ValueError("--posts and --rate must be positive")
    build = resolve_model(settings)
    texts = build.heldout()
    tag = uuid.uuid4().hex[:6]
    run_id = f"chaos{tag}"
    state_root = Path(settings.state_dir) / "chaos" / tag
    settings = isolated_settings(settings, build, f"chaos{tag}", state_root)
    duration_s = posts / rate
    plan = fault_plan(duration_s, worker_kills=worker_kills, triton_kills=triton_kills,
                      broker_restarts=broker_restarts, workers=workers, seed=seed, leader_kills=leader_kills,
                      txn_coordinator_kills=txn_coordinator_kills, group_coordinator_kills=group_coordinator_kills,
                      worker_joins=worker_joins, triton_outage_s=triton_outage_s)
    start_ms = int(time.time() * 1000)

    def events():
        sim = Simulation(texts, scenario, seed, start_ms=start_ms, run_id=run_id)
        return sim.events(arrival_times("poisson", rate, None, posts, seed))

    report: dict = {"config": {"posts": posts, "rate": rate, "workers": workers, "scenario": scenario, "seed": seed,
                               "partitions": settings.partitions, "model": build.version,
                               "outage_policy": settings.text_model_outage_policy,
                               "outage_s": settings.text_model_outage_s, "triton_outage_s": triton_outage_s,
                               "broker_signal": broker_signal,
                               "broker": settings.broker,
                               "brokers": settings.kafka_nodes if settings.broker == "kafka" else 1},
                    "plan": [dataclasses.asdict(f) for f in plan], "faults": []}
    try:
        with LocalStack(settings, workers=workers) as stack:
            ensure_loadgen_topics(settings, stack.bootstrap)
            collector = DecisionCollector(end_consumer(settings, stack.bootstrap, [stack.topics.decisions], paced=True),
                                          f"{run_id}-", pause_s=settings.fetch_pause_ms / 1000)
            collector.start()
            stats = ProduceStats()
            # Apache Kafka keeps producer ids across a node's death: idempotent, a retried send is written once,
            # as a platform's producer does; the embedded broker forgets them at a restart, which an idempotent
            # producer does not survive (loadgen/traffic.py)
            producer = make_producer(settings, stack.bootstrap, idempotent=settings.broker == "kafka")
            bar = progress_bar(total=posts, desc="chaos: posts", unit="post", enabled=progress)
            produce_error: list[str] = []
            paused = threading.Event()
            inject = Injector(stack, producer, paused, broker_signal, seed=seed, triton_outage_s=triton_outage_s)
            pending = list(plan)
            gate = TrafficGate(paused, pending, hold_at_most_s=timeout_s)

            def produce() -> None:
                try:
                    produce_events(producer, settings, gate.events(events()), stats=stats, progress=bar,
                                   clock=gate.clock)
                except Exception as exc:  # noqa: BLE001 - reported, and the run fails
                    produce_error.append(repr(exc))
                    _log.error("chaos: producing failed", extra={"error": repr(exc)})

            producing = threading.Thread(target=produce, name="chaos-produce", daemon=True)
            t0 = gate.clock()
            producing.start()
            try:
                while producing.is_alive():
                    now = gate.clock() - t0
                    while pending and pending[0].at_s <= now:
                        report["faults"].append(inject(pending.pop(0), now))
                    for event in stack.supervise():
                        _log.info("chaos: %s", event)
                        report["faults"].append({"at_s": round(time.monotonic() - t0, 1), "event": event,
                                                 "wall_s": round(time.time(), 3)})
                    producing.join(0.25)
            finally:
                bar.close()
            report["faults"] += [{"kind": f.kind, "skipped": "traffic ended first"} for f in pending]
            undelivered = producer.flush(120)
            report["produce_error"] = produce_error[0] if produce_error else None
            produced_s = time.monotonic() - t0
            # Settled: every post decided and nothing produced anywhere for quiet_s (a degraded post waits in
            # posts.awaiting-text for Triton, a ban's re-decisions come after it, feedback after decisions).
            watched = [*stack.topics.stages.values(), stack.topics.awaiting_text, stack.topics.decisions,
                       *(changelog_topic(settings, t) for t in TABLES)]
            deadline = time.monotonic() + timeout_s
            bar = progress_bar(total=stats.posts, desc="chaos: decided", unit="post", enabled=progress)
            done, last_mark, quiet_since = 0, None, None
            try:
                while time.monotonic() < deadline:
                    for event in stack.supervise():
                        report["faults"].append({"at_s": round(time.monotonic() - t0, 1), "event": event,
                                                 "wall_s": round(time.time(), 3)})
                    got = sum(1 for pid in collector.snapshot() if pid in stats.sent_at)
                    bar.update(got - done)
                    done = got
                    with contextlib.suppress(Exception):  # the broker may be restarting
                        mark = watermarks(settings, stack.bootstrap, watched)
                        if mark != last_mark:
                            last_mark, quiet_since = mark, time.monotonic()
                    quiet_for = time.monotonic() - quiet_since if quiet_since else 0.0
                    # Every post decided and nothing written for quiet_s; or nothing written for a long time
                    # although posts are missing (the broker may have lost them: the read-back tells). Never
                    # while a transaction is open: it holds every read_committed reader, the workers' stages
                    # included, until it ends (a dead worker's is aborted by its restart or, on Apache Kafka,
                    # after transaction.timeout.ms), and what it holds back is still to be applied.
                    if (done >= stats.posts and quiet_for >= quiet_s) or quiet_for >= max(60.0, 4 * quiet_s):
                        try:
                            open_now = held_back(settings, stack.bootstrap, [stack.topics.posts, *watched])
                        except Exception:  # noqa: BLE001 - a broker that does not answer: look again
                            open_now = {"unknown": [-1, -1]}
                        # and every input record committed by the group: a side input (a report, a label) or a
                        # decision's feedback still to be applied changes no watermark until it is
                        behind = stack.group_lag()
                        if behind:
                            waited = report.setdefault("waited_for_group_lag", {"from_s": round(time.monotonic() - t0, 1)})
                            waited.update(until_s=round(time.monotonic() - t0, 1), lag=behind)
                        elif not open_now:
                            break
                        waited = report.setdefault("waited_for_open_transactions",
                                                   {"from_s": round(time.monotonic() - t0, 1)})
                        waited.update(until_s=round(time.monotonic() - t0, 1), partitions=sorted(open_now)[:8])
                    time.sleep(1.0)
            finally:
                bar.close()
            settled_s = time.monotonic() - t0
            collector.stop()
            report["lag_after"] = stack.group_lag()  # input records not committed by the group (None: unknown)
            if done < stats.posts or report["lag_after"] != 0:
                # Not settled: before they are stopped, the live workers say where they are (their logs).
                report["stacks_dumped"] = dump_stacks([w.process for w in stack.workers])
                try:
                    report["held_back_by_open_transactions"] = held_back(
                        settings, stack.bootstrap, [stack.topics.posts, *watched])
                except Exception as exc:  # noqa: BLE001 - a diagnosis; the run's verdict does not need it
                    _log.warning("chaos: could not compare stable offsets", extra={"error": repr(exc)[:300]})
            report["workers_alive"] = sum(w.process.alive() for w in stack.workers)
            report["restarts"] = {name: policy.total for name, policy in stack.restarts.items()}
            for w in stack.workers:  # what they hold is in the changelogs; stopped, nothing changes under the read
                w.stop()
            ours = run_decisions(settings, stack.bootstrap, stack.topics.decisions, run_id, "read_committed")
            at_least_once = run_decisions(settings, stack.bootstrap, stack.topics.decisions, run_id,
                                          "read_uncommitted")
            inputs = {"post": stack.topics.posts, "report": stack.topics.reports,
                      "engagement": stack.topics.engagements, "label": stack.topics.labels, "ban": stack.topics.bans}
            held = input_events(settings, stack.bootstrap, inputs)
            in_topic = {p["post_id"] for kind, p in held if kind == "post"}
            report["decisions"] = count_decisions(ours, in_topic)
            # What an at-least-once (read_uncommitted) reader of the same topic would have seen on top: the
            # decisions of transactions that were aborted (a killed or fenced worker's), made again since.
            report["decisions"]["aborted_decisions"] = len(at_least_once) - len(ours)
            report["decisions"]["at_least_once_duplicates"] = count_decisions(at_least_once, in_topic)[
                "duplicate_decisions"]
            # Acknowledged to the producer, then lost by the broker (noida-db after a SIGKILL): no consumer
            # can decide those; counted apart from what the pipeline lost.
            report["decisions"]["lost_by_broker"] = len(set(stats.sent_at) - in_topic)
            report["decisions"]["events_lost_by_broker"] = stats.events - len(held)
            joins = [f for f in report["faults"] if f.get("kind") == "join"]
            if joins:
                report["joins"] = join_gaps(stack, joins, ours, held)
            if triton_outage_s:
                report["outages"] = triton_outages(report["faults"], ours)
            report["timing"] = {"produce_s": round(produced_s, 1), "settled_s": round(settled_s, 1),
                                "posts_per_s": round(stats.posts / produced_s, 1) if produced_s else None,
                                "producer_undelivered": undelivered, "delivery_errors": stats.delivery_errors,
                                "events_by_kind": dict(stats.by_kind)}
            if check_features:
                t = time.monotonic()
                try:
                    streaming = streaming_tables(settings, stack.bootstrap)
                    post_payloads = {p["post_id"]: p for kind, p in held if kind == "post"}
                    report["features"] = compare_tables(streaming, offline_tables(held, ours, post_payloads))
                except Exception as exc:  # noqa: BLE001 - the rest of the report stands; the run fails
                    _log.exception("chaos: the feature comparison failed")
                    report["features"] = {"equal": False, "error": repr(exc)[:500], "tables": {}, "examples": []}
                report["features"]["seconds"] = round(time.monotonic() - t, 1)
        d = report["decisions"]
        report["ok"] = (not report["produce_error"] and d["lost"] == 0 and d["degraded_not_redecided"] == 0
                        and d["duplicate_decisions"] == 0 and d["duplicates_with_another_verdict"] == 0
                        and report.get("features", {"equal": True})["equal"]
                        and all(o["resumed_after_s"] is not None for o in report.get("outages", [])))
    finally:
        # A failed run keeps its logs: they are all there is to read about it afterwards.
        if report.get("ok") and not keep_state:
            shutil.rmtree(state_root, ignore_errors=True)
        else:
            report["state_kept"] = str(state_root)
            _log.warning("chaos: state and logs kept", extra={"path": str(state_root)})
    return report


def join_gaps(stack, joins: list[dict], decisions: list[dict], held: list[tuple[str, dict]]) -> list[dict]:
    """`decision_gaps` around each join, the owners from the workers' logs."""
    from modpipe.streams.moderation.bundles import partition_for

    partitions = stack.settings.partitions
    user_of = {p["post_id"]: p.get("user_id", "") for kind, p in held if kind == "post"}
    decided = [(partition_for(user_of[d["post_id"]], partitions), _wall_s(d["decided_at"])) for d in decisions
               if int(d.get("revision") or 1) == 1 and d["post_id"] in user_of and d.get("decided_at")]
    logs = {w.name: assignments(w.process.log_path.read_text(errors="replace").splitlines(), stack.topics.posts)
            for w in stack.workers}

    def owners(lo: float, hi: float) -> dict[int, str]:
        """Partition -> the worker of the latest assignment in [lo, hi) that holds it."""
        latest: dict[int, tuple[float, str]] = {}
        for name, events in logs.items():
            for t, ps in events:
                if lo <= t < hi:
                    for p in ps:
                        if p not in latest or t > latest[p][0]:
                            latest[p] = (t, name)
        return {p: name for p, (_, name) in latest.items()}

    out = []
    for join in joins:
        at = join["wall_s"]
        out.append({"target": join["target"], "at_s": join["at_s"],
                    **decision_gaps(decided, at, partitions, owners(0.0, at), owners(at, at + JOIN_AFTER_S))})
    return out


def triton_outages(faults: list[dict], decisions: list[dict]) -> list[dict]:
    """`outage_summary` of each Triton kill: from the kill to the supervisor's next `triton restarted`."""
    out = []
    for i, f in enumerate(faults):
        if f.get("kind") != "triton" or not f.get("killed"):
            continue
        back = next((g for g in faults[i + 1:] if str(g.get("event", "")).startswith("triton restarted")), None)
        out.append({"at_s": f["at_s"], "back_at_s": back and back["at_s"],
                    **outage_summary(f["wall_s"], back and back["wall_s"], decisions)})
    return out


def run_decisions(settings: Settings, bootstrap: str, topic: str, run_id: str, isolation: str) -> list[dict]:
    """The decisions of this run's posts that a reader with `isolation` reads from the decisions topic."""
    records = (orjson.loads(m.value()) for m in read_all(settings, bootstrap, [topic], isolation))
    return [d for d in records if str(d.get("post_id", "")).startswith(f"{run_id}-")]


class Injector:
    """Carries out the faults on a running stack. Workers, Triton and Apache Kafka nodes get SIGKILL, as a crash
    would; a Kafka node is chosen by its role at that moment (`target_node`).

    The embedded broker, with `broker_signal="term"`, is restarted as Apache Kafka's is, without losing what it
    acknowledged: noida-db loses up to a second of acknowledged writes even on SIGTERM while clients write
    (measured: 9 posts of 2,000 and decisions and changelog records in one chaos run), so for a moment the
    traffic is held and the workers are frozen (SIGSTOP), until the broker has saved everything, then it is
    stopped and the workers resume at once: they see the broker go away and come back, as in a rolling
    restart. With "kill" the broker gets SIGKILL with everything running (its losses are counted apart).
    The freeze (SAVE_WAIT_S and the broker's stop) stays well under what a worker's freeze guard allows
    (streams/checkpointing/checkpoint.py: a worker that stood still for longer than its session timeout minus a heartbeat,
    8 s, stops without committing, since its partitions may be another worker's by then)."""

    SAVE_WAIT_S = 2.5  # noida-db saves its data about once a second
    RESTART_WAIT_S = 60.0  # how long a kill waits for its target to be running again
    HEAL_WAIT_S = 120.0  # how long a node fault waits for every node to be back in sync

    def __init__(self, stack, producer, paused: threading.Event, broker_signal: str = "term", seed: int = 0,
                 triton_outage_s: float = 0.0):
        self.stack, self.producer, self.paused, self.broker_signal = stack, producer, paused, broker_signal
        self.triton_outage_s = triton_outage_s
        self.rng = random.Random(f"nodes:{seed}")

    @property
    def cluster(self):
        """The stack's Apache Kafka cluster (None: the embedded broker)."""
        return self.stack.broker if hasattr(self.stack.broker, "nodes") else None

    def target_node(self, fault: Fault) -> int:
        """The node id a broker fault kills, by its role now."""
        cluster, settings = self.cluster, self.stack.settings
        if fault.kind == "leader":
            leaders = Counter(cluster.leader_of(self.stack.topics.posts, p) for p in range(settings.partitions))
            return leaders.most_common(1)[0][0]
        if fault.kind == "group-coordinator":
            return cluster.group_coordinator(settings.app_id)
        if fault.kind == "txn-coordinator":
            return cluster.transaction_coordinator(self.transactional_id(fault.worker or 0))
        return self.rng.choice([n.node_id for n in cluster.nodes])

    def transactional_id(self, index: int) -> str:
        """Worker `index`'s current transactional id, from its log (`<app id>-<worker>-<n>`)."""
        worker = self.stack.workers[index]
        for line in reversed(worker.process.log_path.read_text(errors="replace").splitlines()):
            if '"transactional_id"' in line:
                with contextlib.suppress(ValueError):
                    return orjson.loads(line)["transactional_id"]
        raise RuntimeError(f"{worker.name} has not logged a transactional id yet")

    def __call__(self, fault: Fault, now: float) -> dict:
        if fault.kind == "join":  # a scale-out step: one more worker joins the group
            worker = self.stack.start_worker(fault.worker)
            _log.warning("chaos: a worker joins", extra={"target": worker.name, "at_s": round(now, 1)})
            return {"at_s": round(now, 1), "kind": "join", "target": worker.name, "wall_s": round(time.time(), 3)}
        if fault.kind == "broker" and self.cluster is None and self.broker_signal == "term":
            return self._restart_broker(now)
        node_id = None
        if fault.kind == "worker":
            proc, target = self.stack.workers[fault.worker].process, self.stack.workers[fault.worker].name
        elif fault.kind == "triton":
            proc, target = (self.stack.triton.process if self.stack.triton else None), "triton"
        elif self.cluster is None:
            proc, target = self.stack.broker.process, "broker"
        else:
            node_id = self._wait_for_nodes(fault)
            proc, target = self.cluster.node(node_id).process, f"kafka-{node_id}"
        # a worker that is restarting (it stops itself when the group forgets it, e.g. after the embedded
        # broker's restart) is killed once it is back: each fault hits a live process
        deadline = time.monotonic() + self.RESTART_WAIT_S
        waited: list[str] = []
        while proc is not None and not proc.alive() and time.monotonic() < deadline:
            waited += self.stack.supervise()  # the supervisor restarts it meanwhile
            time.sleep(0.2)
            if fault.kind == "worker":  # a restart replaces the process object
                proc = self.stack.workers[fault.worker].process
            elif fault.kind == "triton" and self.stack.triton:
                proc = self.stack.triton.process
        alive = proc is not None and proc.alive()
        if alive:
            proc.kill()
            if fault.kind == "triton" and self.triton_outage_s:
                # the supervisor sees its death as already noted, with its restart due after the outage
                from modpipe.streams.local.stack import Restarts

                policy = self.stack.restarts.setdefault("triton", Restarts(started_at=time.monotonic()))
                policy.next_at = time.monotonic() + self.triton_outage_s
        _log.warning("chaos: SIGKILL", extra={"target": target, "at_s": round(now, 1), "was_alive": alive,
                                              "fault": fault.kind})
        out = {"at_s": round(now, 1), "kind": fault.kind, "target": target, "killed": alive, "signal": "KILL",
               "wall_s": round(time.time(), 3)}
        if node_id is not None:
            out["node"] = node_id
        if waited:
            out["waited_for_restart"] = waited
        return out

    def _wait_for_nodes(self, fault: Fault) -> int:
        """Every node running, listed by the cluster and back in the in-sync replicas of every partition (a node
        killed before is restarted by the supervisor), then the target's id: a role is looked up on a whole
        cluster, and a node that is running but not caught up yet counts as down: killing another then takes
        min.insync.replicas' quorum away, which is an outage, not a fault this run measures. (A node's process is
        running again a second after its kill, long before it serves: looking at processes and metadata alone
        let a run kill two of three nodes at once.)"""
        deadline = time.monotonic() + self.HEAL_WAIT_S
        while time.monotonic() < deadline:
            self.stack.supervise()
            if all(n.alive() for n in self.cluster.nodes):
                with contextlib.suppress(Exception):  # metadata may lag a restart: look again
                    if (len(self.cluster.broker_ids()) == len(self.cluster.nodes)
                            and self.cluster.under_replicated() == 0):
                        return self.target_node(fault)
            time.sleep(0.5)
        _log.warning("chaos: the cluster has not healed; injecting the fault anyway",
                     extra={"fault": fault.kind, "waited_s": self.HEAL_WAIT_S})
        return self.target_node(fault)

class TrafficGate:
    """Places the faults in the traffic rather than on the wall clock: the traffic is held while `paused` is set
    (a broker node down), and never runs past a fault not yet injected. A restart can keep the supervising loop
    busy for half a minute on a loaded machine (Triton's); the traffic then waits at the next fault's point
    instead of ending before it. `clock` is the traffic's clock, the wall clock less the time held for a fault,
    so the posts after a hold come at their rate, not as a burst, and the faults after it fall where planned."""

    def __init__(self, paused: threading.Event, pending: list[Fault], hold_at_most_s: float = 600.0):
        self.paused, self.pending, self.hold_at_most_s = paused, pending, hold_at_most_s
        self.held_s = 0.0

    def clock(self) -> float:
        return time.monotonic() - self.held_s

    def next_fault_at(self) -> float | None:
        try:
            return self.pending[0].at_s  # the supervising loop pops them on its own thread
        except IndexError:
            return None

    def events(self, events: Iterable) -> Iterator:
        """`events` (each with `offset_s`, seconds from the traffic's start on `clock`), held as above."""
        for event in events:
            started = time.monotonic()
            while time.monotonic() - started < self.hold_at_most_s:
                due = self.next_fault_at()
                if due is None or due > event.offset_s:
                    break
                time.sleep(0.02)
            self.held_s += time.monotonic() - started
            while self.paused.is_set():
                time.sleep(0.02)
            yield event


def format_text(report: dict) -> str:
    d, c = report["decisions"], report["config"]
    lines = [f"chaos: {c['posts']} posts at {c['rate']} posts/s, {c['workers']} workers, seed {c['seed']}",
             "faults: " + ", ".join(f"{f['target']}@{f['at_s']}s" for f in report["faults"] if "target" in f),
             f"sent {d['sent']} (lost by the broker {d['lost_by_broker']}), decided {d['decided']}, lost {d['lost']}, "
             "duplicate decisions read_committed "
             f"{d['duplicate_decisions']} ({d['posts_with_duplicates']} posts, "
             f"{d['duplicates_with_another_verdict']} with another verdict), degraded {d['degraded_posts']} "
             f"(re-decided {d['degraded_redecided']})",
             f"an at-least-once (read_uncommitted) reader would also have seen {d.get('aborted_decisions', 0)} "
             f"aborted decision records ({d.get('at_least_once_duplicates', 0)} duplicate decisions in all)"]
    f = report.get("features")
    if f is not None:
        lines.append("features equal modpipe.features.offline: " + ("yes" if f["equal"] else "NO") + "  " +
                     ", ".join(f"{t}: {v['keys']} keys, {v['differ']} differ, {v['only_streaming']}+"
                               f"{v['only_offline']} one-sided" for t, v in f["tables"].items()))
        for ex in f["examples"]:
            lines.append(f"  {ex['table']}[{ex['key']}] {ex['fields']}: streaming {ex['streaming']} "
                         f"offline {ex['offline']}")
    for o in report.get("outages", []):
        lines.append(f"Triton down {o['down_s']} s from {o['at_s']} s: {o['decided_degraded_during']} decided without "
                     f"the text model meanwhile; decisions with it resumed {o['resumed_after_s']} s after its return")
    for j in report.get("joins", []):
        lines.append(f"{j['target']} joined at {j['at_s']} s: longest stretch without a decision per partition, "
                     f"kept its worker p50 {j['kept']['p50_s']} s, max {j['kept']['max_s']} s "
                     f"({j['kept']['partitions']}); moved p50 {j['moved']['p50_s']} s, max {j['moved']['max_s']} s "
                     f"({j['moved']['partitions']})")
    if report.get("stacks_dumped"):
        lines.append("not settled: stacks dumped into the logs of " + ", ".join(report["stacks_dumped"]))
    if report.get("held_back_by_open_transactions"):
        lines.append("open transactions hold read_committed readers back (partition: [stable, high]): " +
                     str(report["held_back_by_open_transactions"]))
    if report.get("state_kept"):
        lines.append(f"state and logs kept in {report['state_kept']}")
    lines.append("OK" if report["ok"] else "FAILED")
    return "\n".join(lines)
