"""Commands of the streaming path: broker, topics, worker, up. (Clients of it, smoke, demo, loadgen and the
benchmarks, are in loadgen/cli.py.)"""

from __future__ import annotations

import argparse
import sys
import time

from modpipe import exits, log, output
from modpipe.settings import Settings


def _broker(args) -> int:
    from modpipe.services.broker import main_foreground

    settings = Settings.from_env()
    if args.fetch:
        if settings.broker != "kafka":
            print(f"MODPIPE_BROKER={settings.broker}: no Apache Kafka to fetch")
            return 0
        from modpipe.services.apache_kafka import kafka_jars

        jars = kafka_jars(settings.kafka_version, settings.cache_dir)
        print(f"Apache Kafka {settings.kafka_version}: {jars}")
        return 0
    if args.nodes:
        import dataclasses

        settings = dataclasses.replace(settings, kafka_nodes=args.nodes)
    return main_foreground(settings)


def _topics(args) -> int:
    from modpipe.streams.moderation.topics import TopicConfigError, TopicNames, ensure_topics

    settings = Settings.from_env()
    try:
        created = ensure_topics(settings, settings.bootstrap())
    except TopicConfigError as exc:
        print(f"modpipe topics: {exc}", file=sys.stderr)
        return 2
    topics = [{"topic": name, "state": "created" if name in created else "exists", "partitions": settings.partitions}
              for name in TopicNames.from_settings(settings).all()]
    output.emit(topics, args.json,
                lambda rows: "\n".join(f"{r['topic']}\t{r['state']}\t{r['partitions']} partitions" for r in rows))
    return 0


def _worker(args) -> int:
    from modpipe.streams.worker import run_worker

    return run_worker(Settings.from_env(), args.name)


def _up(args) -> int:
    from modpipe.streams.local.stack import LocalStack, StatusLine

    settings = Settings.from_env()
    # SIGINT raises KeyboardInterrupt, SIGTERM exits.Terminated (as modpipe.cli.main sets them): BaseExceptions,
    # which the supervisor's `except Exception` guards around its status line and restarts let through
    exits.raise_on_signals()
    log.dump_stacks_on_signal()  # `kill -USR1` shows where the supervisor waits, as for a worker
    print("starting broker, Triton and workers (logs in "
          f"{settings.state_dir / 'logs'}) ...", file=sys.stderr, flush=True)
    try:
        with LocalStack(settings, workers=args.workers or settings.workers) as stack:
            print(f"ready: KAFKA_BOOTSTRAP_SERVERS={stack.bootstrap} TRITON_URL={stack.triton_url} "
                  f"workers={len(stack.workers)} metrics="
                  + ",".join(w.metrics_url for w in stack.workers), file=sys.stderr, flush=True)
            print("produce posts to the `posts` topic; Ctrl-C stops everything", file=sys.stderr, flush=True)
            status = StatusLine()
            while True:
                time.sleep(args.interval)
                # a dead broker, Triton or worker is restarted with backoff (logs in the state dir say why)
                for event in stack.supervise():
                    print(("\n" if sys.stderr.isatty() else "") + event, file=sys.stderr, flush=True)
                line = status.render(stack)
                if sys.stderr.isatty():
                    print("\r" + line.ljust(160), end="", file=sys.stderr, flush=True)
                else:
                    print(line, file=sys.stderr, flush=True)
    except (KeyboardInterrupt, exits.Terminated) as exc:
        print("\nstopped", file=sys.stderr)
        return exits.status_of(exc)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("broker", help="run the local broker until Ctrl-C: Apache Kafka (MODPIPE_BROKER=kafka, the "
                                      "default) or the embedded noida-db (MODPIPE_BROKER=embedded)")
    p.add_argument("--nodes", type=int, default=None, help="Apache Kafka nodes (default: MODPIPE_KAFKA_NODES)")
    p.add_argument("--fetch", action="store_true", help="only fetch Apache Kafka's jars from Maven Central into the "
                                                        "build cache (MODPIPE_KAFKA_VERSION), then exit")
    p.set_defaults(func=_broker)

    p = sub.add_parser("topics", help="create the topics (idempotent; refuses a wrong partition count)")
    p.add_argument("--json", action="store_true", help="print a JSON list of {topic, state, partitions}")
    p.set_defaults(func=_topics)

    p = sub.add_parser("worker", help="run one stream worker (ingest, feature stages, decisions; exactly once, "
                                      "one Kafka transaction per checkpoint)")
    p.add_argument("--name", default=None, help="stable unique worker name (default: MODPIPE_WORKER_NAME, else host-pid); "
                        "gives the static group member id <app id>-NAME and the transactional ids <app id>-NAME-<n>")
    p.set_defaults(func=_worker)

    p = sub.add_parser("up", help="run broker, Triton and N workers in the foreground with a live status line; "
                                  "whatever dies is restarted with backoff (1, 2, 4 ... 30 s)")
    p.add_argument("--workers", type=int, default=None, help="workers (default: MODPIPE_WORKERS)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between status lines")
    p.set_defaults(func=_up)
