"""Apache Kafka, the broker production runs, started from its Maven Central jars (KRaft, no ZooKeeper).

`kafka_jars` fetches the broker's jars once per version (`kafka_dist/pom.xml`, `mvn dependency:copy-dependencies`)
into the build cache; `KafkaCluster` formats and starts one node (the quick path: `modpipe up`, most tests) or
three (replication 3, `min.insync.replicas=2`: the fault tests and `modpipe chaos --brokers 3`), each node a
combined broker and controller, as the Apache tarball's `kafka-server-start.sh` runs it. Each node is a
supervised child (`ManagedProcess`): readiness is the cluster's metadata listing every node, its log is JSON lines
(`kafka_dist/log4j2.xml`), and a stop is a controlled shutdown (SIGTERM). Production points
KAFKA_BOOTSTRAP_SERVERS at its own cluster and nothing here runs.

The coordinator lookups (`group_coordinator`, `transaction_coordinator`) find the node to kill in a fault test:
Kafka places a group or a transactional id on the partition `abs(id.hashCode()) % partitions` of
`__consumer_offsets` or `__transaction_state`, and that partition's leader coordinates it.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import json
import shutil
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from modpipe import log
from modpipe.services.process import ManagedProcess, ServiceError, free_port, port_open

_log = log.get(__name__)

DIST_DIR = Path(__file__).with_name("kafka_dist")
POM = DIST_DIR / "pom.xml"
LOG4J2 = DIST_DIR / "log4j2.xml"
OFFSETS_PARTITIONS = 10  # __consumer_offsets (Kafka's default 50 costs a small local cluster seconds at start)
TRANSACTION_PARTITIONS = 10  # __transaction_state
FETCH_TIMEOUT_S = 900.0  # Maven's first run also fetches its own plugins


def _which(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise ServiceError(f"`{tool}` not found: Apache Kafka needs a JDK >= 17 and Maven (Debian: apt-get install "
                           f"openjdk-17-jdk-headless maven), or set MODPIPE_BROKER=embedded for the embedded broker, "
                           f"or KAFKA_BOOTSTRAP_SERVERS for a cluster of your own")
    return path


def kafka_jars(version: str, cache_dir: Path) -> Path:
    """The folder of Apache Kafka `version`'s broker jars, fetched from Maven Central on first use (a lock keeps
    two processes from fetching at once; a fetch that failed half way leaves nothing behind)."""
    home = cache_dir / "apache-kafka" / version
    jars = home / "libs"
    if (home / "complete").exists():
        return jars
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / "complete").exists():
            return jars
        mvn = _which("mvn")
        _which("java")
        partial = home / "libs.partial"
        shutil.rmtree(partial, ignore_errors=True)
        started = time.monotonic()
        _log.info("fetching Apache Kafka from Maven Central", extra={"version": version, "into": str(jars)})
        done = subprocess.run([mvn, "-q", "-B", "-f", str(POM), f"-Dkafka.version={version}",
                               "dependency:copy-dependencies", f"-DoutputDirectory={partial}",
                               "-DincludeScope=runtime"], capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
        if done.returncode != 0 or not any(partial.glob(f"kafka_2.13-{version}.jar")):
            raise ServiceError(f"could not fetch Apache Kafka {version} with Maven:\n"
                               f"{(done.stdout + done.stderr)[-3000:]}")
        shutil.rmtree(jars, ignore_errors=True)
        partial.rename(jars)
        (home / "complete").write_text("\n".join(sorted(p.name for p in jars.iterdir())) + "\n")
        _log.info("Apache Kafka fetched", extra={"version": version, "jars": len(list(jars.iterdir())),
                                                 "seconds": round(time.monotonic() - started, 1)})
    return jars


def java_string_hash(s: str) -> int:
    """Java's `String.hashCode()` (over UTF-16 code units, 32-bit overflow)."""
    h = 0
    units = s.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of `__consumer_offsets` (a group id) or `__transaction_state` (a transactional id) that
    holds `key`: Kafka's `Utils.abs(key.hashCode()) % partitions` (its abs maps MIN_VALUE to 0)."""
    return (java_string_hash(key) & 0x7FFFFFFF) % partitions


def random_cluster_id() -> str:
    """What `kafka-storage.sh random-uuid` prints (base64url of 16 random bytes; never one starting with '-')."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cid.startswith("-"):
            return cid


def node_properties(node_id: int, nodes: list[tuple[int, int, int]], data_dir: Path, host: str = "127.0.0.1",
                    extra: dict[str, str] | None = None) -> dict[str, str]:
    """server.properties of a combined broker+controller node. `nodes`: (node id, client port, controller port)
    of every node. One node: every internal topic at replication 1; three or more: replication 3 and
    min.insync.replicas 2, so a write survives one node's loss and is refused rather than kept on one copy."""
    me = next(n for n in nodes if n[0] == node_id)
    replicas = min(3, len(nodes))
    min_isr = 2 if replicas >= 3 else 1
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": ",".join(f"{i}@{host}:{c}" for i, _, c in nodes),
        "listeners": f"PLAINTEXT://{host}:{me[1]},CONTROLLER://{host}:{me[2]}",
        "advertised.listeners": f"PLAINTEXT://{host}:{me[1]}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(replicas),
        "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min_isr),
        "transaction.state.log.num.partitions": str(TRANSACTION_PARTITIONS),
        "unclean.leader.election.enable": "false",
        # a group's first member is answered at once instead of 3 s later (local runs and tests)
        "group.initial.rebalance.delay.ms": "0",
        # the stages' internal topics are purged with DeleteRecords (streams/runtime/purge.py): smaller segments let
        # the broker drop purged data sooner on a small disk
        "log.segment.bytes": str(64 * 1024 * 1024),
        "num.partitions": "1",
    }
    props.update(extra or {})
    return props


@dataclasses.dataclass
class KafkaNode:
    node_id: int
    port: int
    controller_port: int
    home: Path  # server.properties, data/, the log
    process: ManagedProcess | None = None

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def log_path(self) -> Path:
        return self.home / "kafka.log"

    def alive(self) -> bool:
        return self.process is not None and self.process.alive()


class KafkaCluster:
    """`nodes` Apache Kafka nodes on `host`, their data under `base_dir` (kept across stop/start: a restarted
    node finds its logs, topics and offsets)."""

    def __init__(self, base_dir: Path, *, nodes: int = 1, version: str, cache_dir: Path, host: str = "127.0.0.1",
                 ports: list[int] | None = None, heap_mb: int = 512, log_dir: Path | None = None,
                 extra_config: dict[str, str] | None = None):
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self.base_dir, self.version, self.cache_dir, self.host = base_dir, version, cache_dir, host
        self.heap_mb, self.extra_config = heap_mb, dict(extra_config or {})
        self.log_dir = log_dir
        # a cluster started again on its data keeps its ports (the controllers' quorum names them)
        saved = base_dir / "ports.json"
        if saved.exists():
            pairs = [tuple(p) for p in json.loads(saved.read_text())]
        else:
            clients = list(ports or [free_port(host) for _ in range(nodes)])
            pairs = [(p, free_port(host)) for p in clients]
        if len(pairs) != nodes:
            raise ValueError(f"{nodes} nodes need {nodes} ports; {base_dir} holds a cluster of {len(pairs)}")
        self.nodes = [KafkaNode(i + 1, port, controller, base_dir / f"node-{i + 1}")
                      for i, (port, controller) in enumerate(pairs)]

    @property
    def data_dir(self) -> Path:
        return self.base_dir

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{self.host}:{n.port}" for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    # -- lifecycle
    def _format(self, jars: Path) -> None:
        """Writes every node's server.properties and formats its storage, once (a started cluster's data
        directories are reused: the cluster id is in base_dir/cluster.id)."""
        id_file = self.base_dir / "cluster.id"
        voters = [(n.node_id, n.port, n.controller_port) for n in self.nodes]
        cluster_id = id_file.read_text().strip() if id_file.exists() else random_cluster_id()

        def prepare(node: KafkaNode) -> None:
            node.home.mkdir(parents=True, exist_ok=True)
            props = node_properties(node.node_id, voters, node.data_dir, self.host, self.extra_config)
            (node.home / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            if (node.data_dir / "meta.properties").exists():
                return
            done = subprocess.run([_which("java"), "-cp", f"{jars}/*", "kafka.tools.StorageTool", "format",
                                   "-t", cluster_id, "-c", str(node.home / "server.properties")],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise ServiceError(f"formatting Kafka node {node.node_id} failed: {(done.stdout + done.stderr)[-2000:]}")

        self.base_dir.mkdir(parents=True, exist_ok=True)
        (self.base_dir / "ports.json").write_text(json.dumps([[n.port, n.controller_port] for n in self.nodes]))
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(prepare, self.nodes))
        id_file.write_text(cluster_id + "\n")

    def _argv(self, jars: Path, node: KafkaNode) -> list[str]:
        return [_which("java"), f"-Xmx{self.heap_mb}m", "-Xms64m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={LOG4J2}", "-cp", f"{jars}/*", "kafka.Kafka",
                str(node.home / "server.properties")]

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        for node in self.nodes:
            for port in (node.port, node.controller_port):
                if port_open(self.host, port):
                    raise ServiceError(f"port {port} is already in use; is a broker running? Set MODPIPE_BROKER_PORT "
                                       "or KAFKA_BOOTSTRAP_SERVERS to use it")
        jars = kafka_jars(self.version, self.cache_dir)
        started = time.monotonic()
        self._format(jars)
        for node in self.nodes:
            self.start_node(node.node_id, wait=False, jars=jars)
        self.wait_ready(timeout)
        _log.info("Apache Kafka ready", extra={"bootstrap": self.bootstrap, "nodes": len(self.nodes),
                                               "version": self.version, "data_dir": str(self.base_dir),
                                               "seconds": round(time.monotonic() - started, 1)})
        return self

    def start_node(self, node_id: int, *, wait: bool = True, jars: Path | None = None, timeout: float = 120.0) -> None:
        """(Re)start one node on its data directory and ports."""
        node = self.node(node_id)
        if node.alive():
            return
        jars = jars or kafka_jars(self.version, self.cache_dir)
        log_path = (self.log_dir / f"kafka-{node_id}.log") if self.log_dir else node.log_path
        node.process = ManagedProcess(f"kafka-{node_id}", self._argv(jars, node), log_path).start()
        if wait:
            self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until the metadata lists every node that runs (each registered with the controller, unfenced)."""
        live = [n for n in self.nodes if n.process is not None]
        first = live[0].process if live else None
        if first is None:
            raise ServiceError("no Kafka node was started")
        want = {n.node_id for n in live}
        first.wait_ready(lambda: all(n.alive() for n in live) and want <= self.broker_ids(), timeout)

    def broker_ids(self, timeout: float = 1.0) -> set[int]:
        from confluent_kafka.admin import AdminClient

        with contextlib.suppress(Exception):
            admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": int(timeout * 1000),
                                 "logger": log.kafka_client_logger()})
            return set(admin.list_topics(timeout=timeout).brokers)
        return set()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM every node at once (each shuts down in a controlled way while the quorum lasts), SIGKILL one
        that has not exited after `timeout`: what it acknowledged is in its log files already."""
        running = [n.process for n in self.nodes if n.process is not None]
        with ThreadPoolExecutor(max(1, len(running))) as pool:
            list(pool.map(lambda p: p.stop(timeout=timeout), running))

    def kill(self, node_id: int | None = None) -> None:
        """SIGKILL one node (default: all of them)."""
        for node in self.nodes:
            if node_id in (None, node.node_id) and node.process is not None:
                node.process.kill()

    def signal(self, sig: int, node_id: int | None = None) -> None:
        """Send `sig` to one node (default: all), e.g. SIGSTOP to make it stop answering."""
        for node in self.nodes:
            if node_id in (None, node.node_id) and node.process is not None:
                node.process.signal(sig)

    def wipe(self) -> None:
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def processes(self) -> dict[str, ManagedProcess | None]:
        return {f"kafka-{n.node_id}": n.process for n in self.nodes}

    def components(self) -> dict[str, tuple]:
        """name -> (alive?, restart) of each node, for a supervisor (`LocalStack.supervise`)."""
        def restart(node: KafkaNode) -> None:
            if node.process is not None:
                node.process.stop()  # reaps the dead one
            self.start_node(node.node_id, wait=False)
        return {f"kafka-{n.node_id}": (n.alive, lambda n=n: restart(n)) for n in self.nodes}

    # -- who does what (fault tests kill that node)
    def _admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap, "logger": log.kafka_client_logger()})

    def leader_of(self, topic: str, partition: int, timeout: float = 10.0) -> int:
        md = self._admin().list_topics(topic, timeout=timeout)
        return md.topics[topic].partitions[partition].leader

    def under_replicated(self, timeout: float = 5.0) -> int:
        """Partitions (of every topic) without a leader or with a replica outside their in-sync set: a node
        restarted a moment ago serves before it has caught up, and until it is back in every ISR the loss of
        another node takes a partition below min.insync.replicas (or leaves it without a leader)."""
        md = self._admin().list_topics(timeout=timeout)
        return sum(p.leader < 0 or len(p.isrs) < len(p.replicas)
                   for t in md.topics.values() for p in t.partitions.values())

    def group_coordinator(self, group: str) -> int:
        return self.leader_of("__consumer_offsets", coordinator_partition(group, OFFSETS_PARTITIONS))

    def transaction_coordinator(self, transactional_id: str) -> int:
        return self.leader_of("__transaction_state", coordinator_partition(transactional_id, TRANSACTION_PARTITIONS))
