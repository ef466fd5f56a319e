"""The local broker for `modpipe up`, the benchmarks and the tests: Apache Kafka (modpipe/services/apache_kafka.py)
by default, or the embedded noida-db (MODPIPE_BROKER=embedded) on a machine without a JVM.

noida-db (a PyPI wheel carrying a Kafka-protocol broker binary) is used rather than tansu: it returns
correct end offsets, keeps its data across a restart, and supports transactions and read_committed
consumers, which the workers' exactly-once processing needs (docs/operations.md, "Embedded services"). It
does not check the group generation of a transaction's offsets (KIP-447): streams/checkpointing/checkpoint.py says what
fences a zombie worker on it. Production points KAFKA_BOOTSTRAP_SERVERS at a real Kafka cluster instead and
nothing here runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from modpipe import log
from modpipe.services.process import ManagedProcess, ServiceError, free_port, port_open
from modpipe.settings import SETTINGS_SPEC, Settings

_log = log.get(__name__)


def broker_binary() -> Path:
    import noida_db  # the wheel ships the binary next to its package

    path = Path(noida_db.__file__).parent / "noida-db"
    if not path.exists():
        raise ServiceError(f"noida-db binary not found at {path}; reinstall with `make setup`")
    return path


def metadata_ready(bootstrap: str, timeout: float = 1.0) -> bool:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout * 1000),
                         "logger": log.kafka_client_logger()})
    md = admin.list_topics(timeout=timeout)
    return bool(md.brokers)


class EmbeddedBroker:
    """Runs the noida-db binary itself (its console script wraps a child, which could be orphaned)."""

    def __init__(self, data_dir: Path, port: int, host: str = "127.0.0.1", log_path: Path | None = None):
        self.data_dir = data_dir
        self.host = host
        self.port = port
        self.log_path = log_path or data_dir.parent / "logs" / "broker.log"
        self.process: ManagedProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
        if port_open(self.host, self.port):
            raise ServiceError(f"port {self.port} is already in use; is a broker running? Set MODPIPE_BROKER_PORT "
                               "or KAFKA_BOOTSTRAP_SERVERS to use it")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [str(broker_binary()), "start", "--only", "kafka", "--kafka-port", str(self.port),
                "--host", self.host, "--data-dir", str(self.data_dir)]
        self.process = ManagedProcess("broker", argv, self.log_path).start()
        self.process.wait_ready(lambda: port_open(self.host, self.port) and metadata_ready(self.bootstrap), timeout)
        _log.info("broker ready", extra={"bootstrap": self.bootstrap, "data_dir": str(self.data_dir)})
        return self

    def stop(self) -> None:
        if self.process:
            self.process.stop()

    def kill(self) -> None:
        if self.process:
            self.process.kill()

    def wipe(self) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def processes(self) -> dict[str, ManagedProcess | None]:
        return {"broker": self.process}

    def signal(self, sig: int) -> None:
        if self.process:
            self.process.signal(sig)

    def components(self) -> dict[str, tuple]:
        """name -> (alive?, restart), for a supervisor (`LocalStack.supervise`)."""
        def restart() -> None:
            self.stop()  # reaps the dead one and kills what is left of its group
            self.start()  # same port and data directory: the topics and offsets are still there
        return {"broker": (lambda: self.process is not None and self.process.alive(), restart)}


# What the embedded broker needs of every consumer that reads continuously, and Apache Kafka does not: noida-db
# answers an empty fetch at once (no long poll), so consumers pace their fetches (modpipe/services/fetching.py),
# and it has left joins unanswered, so a worker left without an answer joins again (streams/kafka/consumer.py).
# Apache Kafka holds an empty fetch for fetch.wait.max.ms and answers every join: there pacing only adds
# latency, and a rejoin while the group waits for a slow member restarts its rebalance. The settings' defaults
# are Apache Kafka's; whatever starts the embedded broker hands its clients these instead.
# Nor does it keep a transaction across its restart (streams/checkpointing/outbox.py: MODPIPE_ABORT_ON_BROKERS_DOWN), nor
# check the group generation of a transaction's offsets (streams/checkpointing/checkpoint.py: MODPIPE_FREEZE_GUARD).
EMBEDDED_BROKER_TUNING = {"fetch_pause_ms": 20.0, "fetch_idle_pause_ms": 25.0, "group_rejoin_s": 20.0,
                          "abort_on_brokers_down": "on", "freeze_guard": "on"}


def tuned_for(settings: Settings, kind: str) -> Settings:
    """`settings` for clients of a broker of `kind` (`kafka`, `embedded`): the embedded broker's tuning where the
    settings are at their defaults."""
    if kind != "embedded":
        return settings
    changes = {name: value for name, value in EMBEDDED_BROKER_TUNING.items()
               if getattr(settings, name) == SETTINGS_SPEC[name].kind(SETTINGS_SPEC[name].default)}
    return dataclasses.replace(settings, **changes)


def local_broker(settings: Settings, *, data_dir: Path | None = None, port: int | None = None,
                 log_dir: Path | None = None, nodes: int | None = None):
    """A local broker of MODPIPE_BROKER's kind (not started): an `EmbeddedBroker` or an Apache `KafkaCluster` of
    `nodes` (default MODPIPE_KAFKA_NODES). Both have `bootstrap`, `start()`, `stop()`, `kill()`, `components()`."""
    log_dir = log_dir or settings.state_dir / "logs"
    port = port or settings.broker_port
    if settings.broker == "embedded":
        return EmbeddedBroker(data_dir or settings.state_dir / "broker", port, log_path=log_dir / "broker.log")
    from modpipe.services.apache_kafka import KafkaCluster

    return KafkaCluster(data_dir or settings.state_dir / "kafka", nodes=nodes or settings.kafka_nodes,
                        version=settings.kafka_version, cache_dir=settings.cache_dir, ports=[port] + [
                            free_port() for _ in range((nodes or settings.kafka_nodes) - 1)],
                        heap_mb=settings.kafka_heap_mb, log_dir=log_dir)


def broker_kind(broker) -> str:
    return "embedded" if isinstance(broker, EmbeddedBroker) else "kafka"


def broker_pid(broker) -> int | None:
    """The process id of a one-node local broker (for CPU accounting); None for none or several nodes."""
    procs = [p for p in broker.processes().values() if p is not None] if broker is not None else []
    return procs[0].pid if len(procs) == 1 else None


@contextlib.contextmanager
def kafka_endpoint(settings: Settings, *, port: int | None = None) -> Iterator[str]:
    """Bootstrap servers to use: KAFKA_BOOTSTRAP_SERVERS if set, else a local broker for the duration."""
    if settings.bootstrap_servers:
        yield settings.bootstrap_servers
        return
    broker = local_broker(settings, port=port).start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def main_foreground(settings: Settings) -> int:
    """`modpipe broker`: run until Ctrl-C."""
    if settings.bootstrap_servers:
        print(f"KAFKA_BOOTSTRAP_SERVERS={settings.bootstrap_servers} is set: using that cluster, nothing to start.")
        return 0
    import threading

    from modpipe import exits

    stop = threading.Event()
    with kafka_endpoint(settings) as bootstrap:
        if settings.broker == "embedded":  # its clients need what Apache Kafka's do not (EMBEDDED_BROKER_TUNING)
            tuning = " ".join(f"{SETTINGS_SPEC[k].env}={v:g}" if isinstance(v, float) else f"{SETTINGS_SPEC[k].env}={v}"
                              for k, v in EMBEDDED_BROKER_TUNING.items())
            print(f"workers and readers of this broker need: {tuning}", file=sys.stderr, flush=True)
        print(f"broker ready ({settings.broker}): KAFKA_BOOTSTRAP_SERVERS={bootstrap} (data in {settings.state_dir}); "
              "Ctrl-C stops it", file=sys.stderr, flush=True)
        # from here a signal stops the broker through the context above (before: the exception unwinds it)
        stopped_by = exits.StopOnSignal(stop).install()
        while not stop.wait(0.5):
            pass
    return stopped_by.status()


@contextlib.contextmanager
def scratch_endpoint(settings: Settings, tag: str) -> Iterator[tuple[Settings, object | None]]:
    """For a benchmark: `settings` on KAFKA_BOOTSTRAP_SERVERS if set, else on a one-node local broker of its own
    (a fresh directory per run: a run killed without cleanup must not block the next one; wiped afterwards), with
    topics and app id of their own (`tag` + a random suffix). Yields (settings, that broker or None)."""
    import uuid

    own = None
    bootstrap = settings.bootstrap_servers
    if not bootstrap:
        own = local_broker(settings, data_dir=settings.state_dir / f"bench-broker-{uuid.uuid4().hex[:8]}",
                           port=free_port(), nodes=1).start()
        bootstrap = own.bootstrap
        settings = tuned_for(settings, settings.broker)
    try:
        run_id = uuid.uuid4().hex[:6]
        # a metrics port of its own too: a benchmark beside a running stack (or another benchmark) otherwise
        # started a worker that died on MODPIPE_METRICS_PORT's "address already in use"
        yield dataclasses.replace(settings, bootstrap_servers=bootstrap, topic_prefix=f"{settings.topic_prefix}{tag}{run_id}.",
                                  app_id=f"{settings.app_id}-{tag}-{run_id}", metrics_port=free_port()), own
    finally:
        if own:
            own.stop()
            own.wipe()
