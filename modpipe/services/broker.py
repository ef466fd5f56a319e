"""The embedded Kafka-protocol broker for local runs and tests.

noida-db (a PyPI wheel carrying a Kafka-protocol broker binary) is used rather than tansu: it returns
correct end offsets, keeps its data across a restart, and supports transactions and read_committed
consumers, which the workers' exactly-once processing needs (docs/operations.md, "Embedded services"). It
does not check the group generation of a transaction's offsets (KIP-447): streams/checkpoint.py says what
fences a zombie worker on it. Production points KAFKA_BOOTSTRAP_SERVERS at a real Kafka cluster instead and
nothing here runs.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from modpipe import log
from modpipe.services.process import ManagedProcess, ServiceError, port_open
from modpipe.settings import Settings

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


@contextlib.contextmanager
def kafka_endpoint(settings: Settings, *, port: int | None = None) -> Iterator[str]:
    """Bootstrap servers to use: KAFKA_BOOTSTRAP_SERVERS if set, else an embedded broker for the duration."""
    if settings.bootstrap_servers:
        yield settings.bootstrap_servers
        return
    broker = EmbeddedBroker(settings.state_dir / "broker", port or settings.broker_port,
                            log_path=settings.state_dir / "logs" / "broker.log").start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def main_foreground(settings: Settings) -> int:
    """`modpipe broker`: run until Ctrl-C."""
    if settings.bootstrap_servers:
        print(f"KAFKA_BOOTSTRAP_SERVERS={settings.bootstrap_servers} is set: using that cluster, nothing to start.")
        return 0
    import signal
    import threading

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with kafka_endpoint(settings) as bootstrap:
        print(f"broker ready: KAFKA_BOOTSTRAP_SERVERS={bootstrap} (data in {settings.state_dir / 'broker'}); "
              "Ctrl-C stops it", file=sys.stderr, flush=True)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    return 0
