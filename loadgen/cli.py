"""`modpipe loadgen`: simulated platform traffic through the pipeline, measured end to end.

    modpipe loadgen --rate 50 --duration 20 [--count N] [--scenario mixed] [--pattern poisson]
                    [--seed 0] [--workers 1] [--timeout 60] [--json] [--plot run.png]

Uses running services when KAFKA_BOOTSTRAP_SERVERS is set (workers must be running there), otherwise
starts the embedded stack (broker + Triton + N workers) for the duration. The decision consumer is
positioned at the end of `decisions` before anything is produced; after the last post it waits for
every decision (or `--timeout` seconds, or a worker dying), then prints the report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import uuid
from pathlib import Path

from modpipe.loadgen.traffic import PATTERNS, arrival_times, planned_posts
from modpipe.simulation.simulator import SCENARIOS, Simulation

from modpipe import log, output
from modpipe.settings import Settings

_log = log.get(__name__)


def run_loadgen(settings: Settings, bootstrap: str, *, rate: float, duration_s: float | None = None,
                count: int | None = None, scenario: str = "mixed", pattern: str = "poisson", seed: int = 0,
                timeout_s: float = 60.0, progress: bool = True, healthy=lambda: True,
                texts: list[dict] | None = None, lag_interval_s: float = 1.0, run_id: str | None = None,
                process_groups=None) -> dict:
    """Produce the simulated traffic, wait for the decisions, return the report (`measure.summarize`)."""
    from modpipe.loadgen.measure import DecisionCollector, LagSampler, RssSampler, summarize
    from modpipe.loadgen.smoke import end_consumer
    from modpipe.loadgen.traffic import ProduceStats, ensure_loadgen_topics, make_producer, produce_events

    if texts is None:
        from modpipe.textmodel.artifacts import resolve_model

        texts = resolve_model(settings).heldout()
    run_id = run_id or f"lg{uuid.uuid4().hex[:8]}"
    ensure_loadgen_topics(settings, bootstrap)
    collector = DecisionCollector(end_consumer(settings, bootstrap, [settings.topic("decisions")], paced=True), f"{run_id}-",
                                  pause_s=settings.fetch_pause_ms / 1000)
    collector.start()
    sampler = LagSampler(settings, bootstrap, lag_interval_s)
    sampler.start()
    # the embedded stack's processes: their memory over the run (what a soak run is judged by)
    rss = RssSampler(process_groups) if process_groups is not None else None
    if rss is not None:
        rss.start()
    producer = make_producer(settings, bootstrap, ready_timeout_s=10)  # before the clock starts
    collector.settle()
    stats = ProduceStats()
    # event times start now: created_at of each event is when it is scheduled to be produced
    sim = Simulation(texts, scenario, seed, start_ms=int(time.time() * 1000), run_id=run_id)
    arrivals = arrival_times(pattern, rate, duration_s, count, seed)
    config = {"run_id": run_id, "scenario": scenario, "pattern": pattern, "rate": rate, "duration_s": duration_s,
              "count": count, "seed": seed, "partitions": settings.partitions}
    try:
        bar = output.progress_bar(total=planned_posts(pattern, rate, duration_s, count), desc="posts", unit="post",
                                  enabled=progress)
        try:
            produce_events(producer, settings, sim.events(arrivals, horizon_s=duration_s), stats=stats, progress=bar)
        finally:
            bar.close()
        if producer.flush(30) != 0:
            _log.error("not every record was delivered to the broker")
        n = stats.posts
        deadline = time.monotonic() + timeout_s
        bar = output.progress_bar(total=n, desc="decisions", unit="post", enabled=progress)
        try:
            done = 0
            while True:
                got = sum(1 for pid in collector.snapshot() if pid in stats.sent_at)
                bar.update(got - done)
                done = got
                if got >= n or time.monotonic() >= deadline:
                    break
                if not healthy():
                    _log.error("a worker died; stopping the wait for decisions early")
                    break
                time.sleep(0.1)
        finally:
            bar.close()
        time.sleep(min(0.5, lag_interval_s))  # one more lag sample after the last decision
    finally:
        sampler.stop()
        collector.stop()
        if rss is not None:
            rss.stop()
    if stats.delivery_errors:
        _log.error("delivery errors", extra={"count": stats.delivery_errors})
    return summarize(sent_at=stats.sent_at, scheduled_at=stats.scheduled_at, truth=stats.truth,
                     decided=collector.snapshot(), produce_started=stats.started or time.time(),
                     produce_finished=stats.finished or time.time(),
                     events_by_kind=stats.by_kind, lag_samples=sampler.samples, config=config,
                     delivery_errors=stats.delivery_errors, behind_s_max=stats.behind_s_max,
                     rss_samples=rss.samples if rss is not None else None)


def loadgen(settings: Settings, *, workers: int = 1, **kwargs) -> dict:
    """`run_loadgen` against running services (KAFKA_BOOTSTRAP_SERVERS), else on the embedded stack."""
    if settings.bootstrap_servers:
        return run_loadgen(settings, settings.bootstrap_servers, **kwargs)
    from modpipe.streams.local.stack import LocalStack

    with contextlib.ExitStack() as stack:
        local = stack.enter_context(LocalStack(settings, workers=workers))
        return run_loadgen(settings, local.bootstrap, healthy=lambda: all(w.process.alive() for w in local.workers),
                           process_groups=local.process_groups, **kwargs)


def _loadgen(args: argparse.Namespace) -> int:
    from modpipe.loadgen.measure import format_table, plot

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("modpipe loadgen: --plot needs matplotlib (pip install 'matplotlib>=3.8,<3.11')", file=sys.stderr)
            return 2
    duration = args.duration
    if duration is None and args.count is None:
        duration = 30.0
    report = loadgen(Settings.from_env(), workers=args.workers, rate=args.rate, duration_s=duration,
                     count=args.count, scenario=args.scenario, pattern=args.pattern, seed=args.seed,
                     timeout_s=args.timeout, progress=not args.json)
    if args.plot:
        plot(report, args.plot)
    if args.json:
        print(json.dumps(report))
    else:
        print(format_table(report))
        if args.plot:
            print(f"plot written to {args.plot}", file=sys.stderr)
    return 0 if report["lost"] == 0 and report["sent"]["delivery_errors"] == 0 else 1


BENCH_DESCRIPTION = """\
With no TARGET: the end-to-end comparison, one run on this machine, the same texts for all paths:

  pipeline  modpipe end to end (broker -> ingest -> feature stages -> Triton batches -> decisions)
            on a local stack of --workers worker processes, text cache off: posts/s at saturation
            (every post produced up front, decisions/s over the steady part), p50/p95/p99
            end-to-end latency (each post's scheduled send -> decision visible; beside it from the
            produce() call, which hides a producer's lag) at --low-rate posts/s and at --load x
            the saturation rate (or at --load-rate posts/s); then saturation again with the text cache on;
  seed      one synchronous gRPC request per post to the same Triton, padded to 128, batch 1;
  ceiling   in-process ONNX Runtime on the same model file and threads, best batch size,
            per-batch padding; and the same with the texts sorted by length first.

It prints posts/s of each path, the targets (worker and broker CPU per post, pipeline/sorted ceiling,
latency at 5 posts/s and at 50% load) with the measured values, the ratios pipeline/seed and
pipeline/ceiling, where the pipeline's CPU went, the capacity per worker core beside what one GPU
serves, and how busy the machine was with other work; the markdown table goes to --markdown. The
stack runs on its own broker (MODPIPE_BROKER: Apache Kafka by default), ports, topics and state directory
(KAFKA_BOOTSTRAP_SERVERS / TRITON_URL, when set, are used instead of starting them). Before each pass, the
posts and decisions the earlier passes left on its own broker are deleted (the tables' changelogs stay):
the embedded broker's CPU grows with what it holds, Apache Kafka's does not (--keep-records keeps them).

Targets: `model` (Triton vs ONNX Runtime by batch size and padding), `features` (the feature path
with the text model off vs a plain Kafka loop), `transport` (exactly-once delivery options: records/s,
CPU per record, commit latency).
"""


CHAOS_DESCRIPTION = """\
Simulated traffic (posts, reports, engagements, labels, bans) through a local stack of its own (Apache
Kafka of --brokers nodes, or the embedded broker; Triton; --workers workers; own ports, topics and state
directory) while workers, Triton and broker nodes (the leader of the posts partitions, a worker's transaction
coordinator, the group coordinator, or any) are SIGKILLed at seeded times over the traffic; the supervisor of
`modpipe up` restarts each (--triton-outage keeps Triton down a while first: the report says when decisions with
the text model resumed). --worker-joins starts more workers meanwhile (a scale-out step): the report gives each
posts partition's longest stretch without a decision around each join, for partitions that kept their worker
and those that moved.
Then, read back from the broker as a read_committed reader (the platform): posts sent / decided / lost,
duplicate decisions (same post_id and revision) and those with another verdict, degraded decisions and their
re-decisions, and whether every feature table (its changelog) equals modpipe.features.offline over the same events;
and read_uncommitted, the decisions of aborted transactions an at-least-once reader would have seen on top.
Exit 1 if a post was lost, a decision was seen twice or changed verdict, a degraded decision was not
decided again, a table differs, or no decision with the text model followed an outage. See loadgen/chaos.py.
"""


def _bench_e2e(args: argparse.Namespace) -> int:
    from modpipe.loadgen.bench.report import format_text, write_markdown
    from modpipe.loadgen.bench.runs import BenchError, run

    settings = Settings.from_env()
    batches = [int(b) for b in args.ceiling_batch_sizes.split(",") if b.strip()]
    try:
        report = run(settings, n_posts=args.posts, workers=args.workers, load=args.load, load_rate=args.load_rate,
                     low_rate=args.low_rate,
                     low_posts=args.low_posts, arrivals=args.arrivals,
                     scenario=args.scenario, seed=args.seed, ceiling_batch_sizes=batches, timeout_s=args.timeout,
                     progress=not args.json, keep_state=args.keep_state, baseline_posts=args.baseline_posts,
                     profile_dir=args.profile_workers, keep_records=args.keep_records)
    except (BenchError, ValueError) as exc:
        print(f"modpipe bench: {exc}", file=sys.stderr)
        return 1
    path = write_markdown(report, args.markdown or settings.state_dir / "bench" / "e2e.md")
    report["markdown_path"] = str(path)
    print(json.dumps(report) if args.json else format_text(report))
    print(f"markdown table written to {path}", file=sys.stderr)
    return 0


def register_bench(sub: argparse._SubParsersAction) -> None:
    """`modpipe bench` with no target runs the end-to-end comparison; its targets stay as they are."""
    from modpipe.loadgen.bench.ceilings import DEFAULT_CEILING_BATCHES
    from modpipe.loadgen.bench.runs import DEFAULT_LOAD, DEFAULT_LOW_POSTS, DEFAULT_LOW_RATE, DEFAULT_POSTS

    from modpipe.serving.cli import _bench_subparsers

    _bench_subparsers(sub).metavar = "[TARGET]"  # optional: no target = the end-to-end comparison
    p = sub.choices["bench"]
    p.description = BENCH_DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--posts", type=int, default=DEFAULT_POSTS,
                   help=f"posts per pass (saturation, latency, seed, ceiling); default {DEFAULT_POSTS}")
    p.add_argument("--baseline-posts", type=int, default=None, metavar="N",
                   help="run the seed and the ceilings on the first N posts only (default: all --posts); their "
                        "rates are per text, and beside a GPU the CPU ceiling of a long pass takes longer than it")
    p.add_argument("--profile-workers", type=Path, default=None, metavar="DIR",
                   help="sample every worker with py-spy during the saturation pass (raw stacks into DIR) and report "
                        "where its event loop went; needs py-spy and ptrace rights (root or CAP_SYS_PTRACE), and "
                        "slows the profiled pass")
    p.add_argument("--workers", type=int, default=None, help="stream workers of the pipeline (default MODPIPE_WORKERS)")
    p.add_argument("--load", type=float, default=DEFAULT_LOAD,
                   help=f"latency pass rate as a fraction of the saturation rate (default {DEFAULT_LOAD})")
    p.add_argument("--load-rate", type=float, default=None, metavar="POSTS_PER_S",
                   help="offer this fixed rate in the load pass instead of --load x saturation: the same rate in "
                        "every run, to compare two versions (the saturation reading moves between runs); the "
                        "report gives the share of this run's saturation it was")
    p.add_argument("--low-rate", type=float, default=DEFAULT_LOW_RATE,
                   help=f"posts/s of the low-load latency pass (default {DEFAULT_LOW_RATE:g})")
    p.add_argument("--low-posts", type=int, default=DEFAULT_LOW_POSTS,
                   help=f"posts of the low-load latency pass (default {DEFAULT_LOW_POSTS})")
    p.add_argument("--arrivals", choices=("poisson", "constant"), default="poisson",
                   help="arrivals of the latency passes (default poisson)")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="mixed", help="simulation the posts come from")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulation and the arrivals")
    p.add_argument("--ceiling-batch-sizes", default=",".join(map(str, DEFAULT_CEILING_BATCHES)),
                   help="batch sizes tried for the ONNX Runtime ceiling (default %(default)s)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for a pass's decisions")
    p.add_argument("--markdown", metavar="FILE.md", default=None,
                   help="where to write the markdown table (default $MODPIPE_STATE_DIR/bench/e2e.md)")
    p.add_argument("--keep-state", action="store_true", help="keep the run's broker data, tables and logs")
    p.add_argument("--keep-records", action="store_true",
                   help="do not delete the posts and decisions earlier passes left on the embedded broker before "
                        "each pass (its CPU grows with what it holds; Apache Kafka's does not)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object (no progress bars)")
    p.set_defaults(func=_bench_e2e)


def _smoke(args) -> int:
    from modpipe.loadgen.smoke import smoke

    result = smoke(Settings.from_env(), args.posts, workers=args.workers, timeout_s=args.timeout,
                   progress=not args.json)
    output.emit(result, args.json)
    return 0 if result["lost"] == 0 and result["dlq_reasons_match"] else 1


def _fuzz(args) -> int:
    from modpipe.loadgen.fuzz import fuzz

    result = fuzz(Settings.from_env(), args.emoji_links or args.records, seed=args.seed, workers=args.workers,
                  timeout_s=args.timeout, progress=not args.json, emoji_links=bool(args.emoji_links),
                  link_chars=args.link_chars)
    output.emit(result, args.json)
    ok = result["lost"] == 0 and not result.get("dead_letter_reason_mismatches") and \
        not result.get("valid_records_dead_lettered") and not result.get("dead_letters")
    return 0 if ok and result.get("workers_alive", True) and not result.get("lag_after") else 1


def _chaos(args) -> int:
    from modpipe.loadgen.chaos import format_text, run_chaos

    # SIGTERM unwinds like Ctrl-C (modpipe.exits.Terminated): the stack's processes are stopped, none is left behind
    try:
        report = run_chaos(Settings.from_env(), posts=args.posts, rate=args.rate, workers=args.workers,
                           worker_kills=args.worker_kills, triton_kills=args.triton_kills,
                           broker_restarts=args.broker_restarts, seed=args.seed, scenario=args.scenario,
                           timeout_s=args.timeout, check_features=not args.no_feature_check, progress=not args.json,
                           keep_state=args.keep_state, broker_signal=args.broker_signal, brokers=args.brokers,
                           leader_kills=args.leader_kills, txn_coordinator_kills=args.txn_coordinator_kills,
                           group_coordinator_kills=args.group_coordinator_kills, worker_joins=args.worker_joins,
                           triton_outage_s=args.triton_outage)
    except ValueError as exc:
        print(f"modpipe chaos: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report) if args.json else format_text(report))
    return 0 if report["ok"] else 1


def _demo(args) -> int:
    from modpipe.loadgen.demo import run_demo

    return run_demo(Settings.from_env(), posts=args.posts, workers=args.workers, keep_running=args.keep_running)


def broker_kinds(settings: Settings, given: str | None) -> list[str]:
    """The local brokers a benchmark runs on, one after the other in the same invocation (`--brokers`, a
    comma-separated list of `kafka` and `embedded`; default MODPIPE_BROKER). With KAFKA_BOOTSTRAP_SERVERS set
    the benchmark runs once, on that cluster."""
    if settings.bootstrap_servers:
        return ["external"]
    kinds = [k.strip() for k in (given or settings.broker).split(",") if k.strip()]
    unknown = [k for k in kinds if k not in ("kafka", "embedded")]
    if unknown or not kinds:
        raise SystemExit(f"--brokers takes kafka and/or embedded, not {given!r}")
    return kinds


def _on_broker(settings: Settings, kind: str) -> Settings:
    import dataclasses

    return settings if kind == "external" else dataclasses.replace(settings, broker=kind)


def _bench_features(args) -> int:
    from modpipe.loadgen.bench_features import run

    settings = Settings.from_env()
    reports = {kind: run(_on_broker(settings, kind), n_posts=args.posts, workers=args.workers, progress=not args.json,
                         profile_dir=args.profile_workers / kind if args.profile_workers else None)
               for kind in broker_kinds(settings, args.brokers)}
    report = next(iter(reports.values())) if len(reports) == 1 else {"brokers": reports}
    output.emit(report, args.json)
    return 0


def _bench_state(args) -> int:
    from modpipe.loadgen.bench_state import BACKENDS, run

    backends = tuple(b for b in args.backends.split(",") if b) if args.backends else BACKENDS
    bad = set(backends) - set(BACKENDS)
    if bad:
        raise SystemExit(f"--backends: unknown {sorted(bad)} (choose from {', '.join(BACKENDS)})")
    report = run(Settings.from_env(), n=args.keys, backends=backends, progress=not args.json,
                 timeout_s=args.timeout)
    output.emit(report, args.json)
    return 0


def _bench_transport(args) -> int:
    from modpipe.loadgen.bench import transport
    from modpipe.loadgen.bench.transport_report import format_text

    from modpipe.services.broker import broker_pid, local_broker
    from modpipe.services.process import free_port

    base = Settings.from_env()
    ints = lambda text: tuple(int(x) for x in text.split(",") if x.strip())  # noqa: E731
    reports = {}
    for kind in broker_kinds(base, args.brokers):
        settings = _on_broker(base, kind)
        broker = None
        if not settings.bootstrap_servers:
            # a directory per run, as `bench features`: a run killed without cleanup must not block the next one
            broker = local_broker(settings, data_dir=settings.state_dir / f"bench-broker-{uuid.uuid4().hex[:8]}",
                                  port=free_port(), nodes=1).start()
        try:
            reports[kind] = transport.run(
                broker.bootstrap if broker else settings.bootstrap_servers, records=args.records,
                intervals_ms=ints(args.intervals), aiokafka_intervals_ms=ints(args.aiokafka_intervals),
                paced_rate=args.paced_rate, paced_s=args.paced_seconds, profile=not args.no_profile,
                broker_pid=broker_pid(broker), progress=not args.json)
            reports[kind]["broker"] = kind
        finally:
            if broker:
                broker.stop()
                broker.wipe()
    ok = all(r["all_checks_ok"] for r in reports.values())
    if args.json:
        print(json.dumps(next(iter(reports.values())) if len(reports) == 1 else {"brokers": reports,
                                                                                   "all_checks_ok": ok}))
    else:
        print("\n\n".join(f"== broker: {kind} ==\n{format_text(r)}" for kind, r in reports.items()))
    return 0 if ok else 1


def _bench_latency_split(args) -> int:
    from modpipe.loadgen.bench import latency_split

    settings = Settings.from_env()
    bootstrap = args.bootstrap or settings.bootstrap_servers or f"127.0.0.1:{settings.broker_port}"
    rows = latency_split.read(settings, bootstrap, args.seconds)
    if args.out:
        args.out.write_bytes(json.dumps(rows).encode())
    if not rows:
        print("modpipe bench latency-split: no decisions seen: is anything sending posts?", file=sys.stderr)
        return 1
    output.emit(latency_split.summarise(rows), args.json, latency_split.format_text)
    return 0


def register_clients(sub: argparse._SubParsersAction) -> None:
    """smoke, demo and `bench features`: clients of the running pipeline."""
    from modpipe.serving.cli import _bench_subparsers

    p = _bench_subparsers(sub).add_parser(
        "features", help="posts/s through ingest + feature stages (text model off) vs a plain Kafka loop")
    p.add_argument("--posts", type=int, default=3000, help="posts sent through each path (default 3000)")
    p.add_argument("--workers", type=int, default=1, help="stream workers of the feature path (default 1)")
    p.add_argument("--brokers", default=None, help="local brokers to run on, one after the other: kafka, embedded "
                                                   "or kafka,embedded (default MODPIPE_BROKER)")
    p.add_argument("--profile-workers", type=Path, default=None, metavar="DIR",
                   help="py-spy on each worker through the local-hops pass, raw stacks under DIR/<broker>/ and "
                        "each worker's top functions in the report (needs root or CAP_SYS_PTRACE; slows that pass)")
    p.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")
    p.set_defaults(func=_bench_features)

    from modpipe.loadgen import bench_state

    p = _bench_subparsers(sub).add_parser(
        "state", help="table state with N distinct users, links and IPs: memory, disk, bytes per key, restore "
                      "after a SIGKILL, posts/s; RocksDB tables against in-memory ones",
        description=bench_state.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=100_000,
                   help="posts, each with a user, link and IP address of its own (default %(default)s)")
    p.add_argument("--backends", default=None, help="rocksdb, memory or rocksdb,memory (default both)")
    p.add_argument("--timeout", type=float, default=7200.0, help="seconds each pass may take (default %(default)g)")
    p.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")
    p.set_defaults(func=_bench_state)

    from modpipe.loadgen.bench import transport

    p = _bench_subparsers(sub).add_parser(
        "transport", help="exactly-once delivery options (confluent/aiokafka, idempotent/transactional) side by "
                          "side: records/s, CPU per record, commit latency",
        description=transport.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=transport.DEFAULT_RECORDS,
                   help="output records of each saturation pass (default %(default)s)")
    p.add_argument("--intervals", default=",".join(map(str, transport.DEFAULT_INTERVALS_MS)),
                   help="checkpoint intervals in ms of the confluent transactional passes (default %(default)s)")
    p.add_argument("--aiokafka-intervals", default=",".join(map(str, transport.DEFAULT_AIOKAFKA_INTERVALS_MS)),
                   help="checkpoint intervals in ms of the aiokafka transactional passes (default %(default)s)")
    p.add_argument("--paced-rate", type=float, default=transport.DEFAULT_PACED_RATE,
                   help="inputs/s of the paced passes (default %(default)g)")
    p.add_argument("--paced-seconds", type=float, default=transport.DEFAULT_PACED_S,
                   help="length of each paced pass (default %(default)g)")
    p.add_argument("--no-profile", action="store_true", help="skip the profiled passes")
    p.add_argument("--brokers", default=None, help="local brokers to run on, one after the other: kafka, embedded "
                                                   "or kafka,embedded (default MODPIPE_BROKER)")
    p.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")
    p.set_defaults(func=_bench_transport)

    from modpipe.loadgen.bench import latency_split

    p = _bench_subparsers(sub).add_parser(
        "latency-split", help="where each decision's latency goes (fetch + features + Triton, produce, commit + "
                              "read), read from the decisions topic while something sends posts",
        description=latency_split.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", default=None, help="the broker (default KAFKA_BOOTSTRAP_SERVERS, else "
                                                     "127.0.0.1:MODPIPE_BROKER_PORT: `modpipe up`'s)")
    p.add_argument("--seconds", type=float, default=75.0, help="how long to read (default %(default)g)")
    p.add_argument("--out", type=Path, default=None, help="write every decision's times here (JSON)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_bench_latency_split)

    p = sub.add_parser("smoke", help="send N held-out posts + malformed records and check every one is handled")
    p.add_argument("--posts", type=int, default=200, help="held-out posts to send (default 200)")
    p.add_argument("--workers", type=int, default=1, help="workers to start when the embedded stack is used")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for all verdicts")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_smoke)

    p = sub.add_parser("fuzz", help="hostile records into every input topic; check each is dead-lettered with its "
                                    "reason or processed, and the worker stays up",
                       description="Random bytes, broken and deeply nested JSON, wrong types, huge numbers, NaN, "
                                   "surrogates, 10 MB values, odd URLs, IPs and timestamps, 100,000-step journeys "
                                   "into posts, reports, engagements, labels and bans (loadgen/fuzz.py). Exit 1 if "
                                   "any record is lost or misrouted, a worker died or lag remains.")
    p.add_argument("--records", type=int, default=10_000, help="records to send, spread over the topics (default 10000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generator (default 0)")
    p.add_argument("--workers", type=int, default=1, help="workers to start when the embedded stack is used")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for every outcome")
    p.add_argument("--emoji-links", type=int, default=0, metavar="N",
                   help="instead: N valid posts with distinct ~4,000-character emoji links, each to be decided; "
                        "reports the first worker's resident memory before, at its peak and after")
    p.add_argument("--link-chars", type=int, default=4000, help="characters of each --emoji-links link")
    p.add_argument("--json", action="store_true", help="print one JSON object (no progress bars)")
    p.set_defaults(func=_fuzz)

    p = sub.add_parser("chaos", help="simulated traffic through the local stack while workers, Triton and broker "
                                     "nodes are SIGKILLed at seeded times; checks nothing is lost or counted twice",
                       description=CHAOS_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--posts", type=int, default=2000, help="posts to send (default 2000)")
    p.add_argument("--rate", type=float, default=40.0, help="mean posts per second, Poisson (default 40)")
    p.add_argument("--workers", type=int, default=2, help="stream workers (default 2)")
    p.add_argument("--worker-kills", type=int, default=5, help="worker SIGKILLs, a random worker each (default 5)")
    p.add_argument("--triton-kills", type=int, default=2, help="Triton SIGKILLs (default 2)")
    p.add_argument("--brokers", type=int, default=None,
                   help="Apache Kafka nodes of the run's cluster (default MODPIPE_KAFKA_NODES; 3: replication 3, "
                        "min.insync.replicas 2)")
    p.add_argument("--broker-restarts", type=int, default=1,
                   help="broker kills: on Apache Kafka a SIGKILL of a seeded node; on the embedded broker a restart "
                        "(--broker-signal); default 1")
    p.add_argument("--leader-kills", type=int, default=0,
                   help="SIGKILLs of the Kafka node leading the most `posts` partitions at that moment (default 0)")
    p.add_argument("--txn-coordinator-kills", type=int, default=0,
                   help="SIGKILLs of the transaction coordinator of a random worker's transactional id (default 0)")
    p.add_argument("--group-coordinator-kills", type=int, default=0,
                   help="SIGKILLs of the workers' consumer-group coordinator (default 0)")
    p.add_argument("--worker-joins", type=int, default=0,
                   help="workers started during the traffic, one more each (a scale-out step); the report gives "
                        "each partition's longest stretch without a decision around each join (default 0)")
    p.add_argument("--triton-outage", type=float, default=0.0, metavar="SECONDS",
                   help="keep Triton down this long after each of its kills, then restart it (an outage; the "
                        "kill comes early enough for it to end under traffic); the report gives per outage the "
                        "posts decided without the text model meanwhile and how soon after its return decisions "
                        "with it resume (default 0: restarted at once)")
    p.add_argument("--broker-signal", choices=("term", "kill"), default="term",
                   help="embedded broker only: how it is stopped: term (a clean stop, as a rolling restart) or kill "
                        "(SIGKILL: it then loses up to ~1 s of acknowledged writes, counted apart as lost by the "
                        "broker); default term")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="mixed", help="simulation the traffic comes from")
    p.add_argument("--seed", type=int, default=0, help="seed of the traffic and of the fault times (default 0)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds to wait after the traffic for every decision and a quiet broker (default 600)")
    p.add_argument("--no-feature-check", action="store_true",
                   help="skip the comparison of the feature tables with modpipe.features.offline")
    p.add_argument("--keep-state", action="store_true",
                   help="keep the run's broker data, tables and logs also when it passes (a failed run keeps them)")
    p.add_argument("--json", action="store_true", help="print one JSON object (no progress bars)")
    p.set_defaults(func=_chaos)

    p = sub.add_parser("demo", help="start the local stack, send a burst of posts, show verdicts flowing")
    p.add_argument("--posts", type=int, default=300, help="held-out posts to send (default 300)")
    p.add_argument("--workers", type=int, default=2, help="stream workers to start (default 2)")
    p.add_argument("--keep-running", action="store_true", help="keep the stack up with its status line")
    p.set_defaults(func=_demo)


def register(sub: argparse._SubParsersAction) -> None:
    register_bench(sub)
    register_clients(sub)
    # argparse expands %-formats in help texts: the descriptions say things like "10% spam"
    scenarios = "; ".join(f"{s.name}: {s.description}" for s in SCENARIOS.values()).replace("%", "%%")
    p = sub.add_parser("loadgen", help="simulated platform traffic (posts + reports, engagements, labels, bans) "
                                       "through the pipeline; reports throughput, latency, lag and accuracy",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=50.0, help="mean posts per second (default 50)")
    p.add_argument("--duration", type=float, default=None,
                   help="seconds of traffic (default 30 when --count is not given either)")
    p.add_argument("--count", type=int, default=None, help="posts to send (with --duration: whichever ends first)")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="mixed", help=scenarios)
    p.add_argument("--pattern", choices=PATTERNS, default="poisson",
                   help="arrivals: constant, poisson, burst (0.25x 8 s / 4x 2 s), ramp (0 -> 2x); mean = --rate")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulation and the arrivals")
    p.add_argument("--workers", type=int, default=1, help="workers to start when the embedded stack is used")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for decisions after the last post")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object (no progress bars)")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw latency, throughput and lag over time (needs matplotlib)")
    p.set_defaults(func=_loadgen)
