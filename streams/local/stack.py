"""The local stack: broker + Triton + N workers as child processes (`modpipe up`, smoke, tests).

The broker is Apache Kafka (one node, or MODPIPE_KAFKA_NODES) or, with MODPIPE_BROKER=embedded, noida-db; the
workers get the settings that broker needs (modpipe/services/broker.py, `tuned_for`).
Services given through KAFKA_BOOTSTRAP_SERVERS / TRITON_URL are used instead of being started.
Every child runs in its own process group and is stopped on exit, so Ctrl-C leaves no orphans.
`supervise()` restarts a child that died (the broker on its data directory, Triton on its ports, a worker
under its name) with exponential backoff per component (`Restarts`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from modpipe.streams.moderation.topics import TopicNames, ensure_topics
from modpipe.streams.runtime.health import READY_PATH
from prometheus_client.parser import text_string_to_metric_families

from modpipe import log
from modpipe.services.broker import local_broker, tuned_for
from modpipe.services.process import ManagedProcess, ServiceError, free_port, port_free
from modpipe.settings import Settings

_log = log.get(__name__)


def worker_ready(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a worker's readiness probe passes."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{READY_PATH}", timeout=2) as resp:
            return resp.status == 200
    except OSError:  # refused, 503 (HTTPError), timeout
        return False


@dataclass
class Restarts:
    """When to restart one component: 1, 2, 4 ... 30 s after each death in a row; a component that stayed
    up `healthy_after_s` starts again from the shortest delay. Pure bookkeeping: times are passed in."""

    base_s: float = 1.0
    max_s: float = 30.0
    healthy_after_s: float = 60.0
    failures: int = 0  # deaths in a row (reset once it stays up long enough)
    total: int = 0  # restarts done, for the status line
    next_at: float | None = None  # when the pending restart is due; None: none pending
    started_at: float = 0.0

    def died(self, now: float) -> float:
        """Note a death (once per death); returns when to restart."""
        if self.next_at is None:
            if now - self.started_at >= self.healthy_after_s:
                self.failures = 0
            self.next_at = now + min(self.max_s, self.base_s * 2 ** min(self.failures, 16))
            self.failures += 1
        return self.next_at

    def due(self, now: float) -> bool:
        return self.next_at is not None and now >= self.next_at

    def restarted(self, now: float) -> None:
        self.total += 1
        self.next_at = None
        self.started_at = now

# A worker stops in well under a second (its shutdown grace for Triton batches is MODPIPE_SHUTDOWN_GRACE_S)
WORKER_STOP_S = 20.0


@dataclass
class WorkerProcess:
    name: str
    metrics_port: int
    process: ManagedProcess

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def stop(self, timeout: float = WORKER_STOP_S) -> int | None:
        """SIGTERM (the worker commits what it finished and leaves the group); one that has not exited after
        `timeout` writes its stacks to its log before it is SIGKILLed."""
        return self.process.stop(timeout, dump_signal=log.STACK_DUMP_SIGNAL)


class LocalStack:
    def __init__(self, settings: Settings, workers: int = 1, extra_env: dict[str, str] | None = None):
        self.settings = settings = tuned_for(settings, settings.broker)
        self.n_workers = workers
        self.extra_env = dict(extra_env or {})
        self.broker = None  # the local broker this stack started (modpipe/services/broker.py), if any
        self.triton = None
        self.bootstrap = settings.bootstrap_servers
        self.triton_url = settings.triton_url
        self.killed_at_stop: list[str] = []  # workers that had to be SIGKILLed by the last stop()
        self.workers: list[WorkerProcess] = []
        self.topics = TopicNames.from_settings(settings)
        self.restarts: dict[str, Restarts] = {}

    # -- lifecycle
    def start(self) -> LocalStack:
        try:
            if not self.bootstrap:
                self.broker = local_broker(self.settings).start()
                self.bootstrap = self.broker.bootstrap
            if not self.triton_url and self.settings.text_model == "on":
                from modpipe.serving.server import TritonServer

                self.triton = TritonServer(self.settings).start()
                self.triton_url = self.triton.grpc_url
            ensure_topics(self.settings, self.bootstrap)
            for i in range(self.n_workers):
                self.start_worker(i)
            self.wait_workers_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def worker_env(self, index: int) -> dict[str, str]:
        env = dict(self.settings.to_env())
        env.update({
            "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap, "TRITON_URL": self.triton_url or "",
            "MODPIPE_METRICS_PORT": str(worker_port(self.settings.metrics_port, index)),
            # as the image sets it (Dockerfile): glibc's per-thread arenas keep what librdkafka's threads freed
            "MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", "2"),
        })
        env.update(self.extra_env)
        return {**os.environ, **env}

    def start_worker(self, index: int) -> WorkerProcess:
        name = f"worker-{index}"
        env = self.worker_env(index)
        proc = ManagedProcess(name, [sys.executable, "-m", "modpipe", "worker", "--name", name],
                              self.settings.state_dir / "logs" / f"{name}.log", env=env).start()
        worker = WorkerProcess(name, int(env["MODPIPE_METRICS_PORT"]), proc)
        if index < len(self.workers):
            self.workers[index] = worker
        else:
            self.workers.append(worker)
        return worker

    def wait_workers_ready(self, timeout: float = 90.0) -> None:
        """Ready = every worker's /readyz passes (ban log read, paths warm, partitions assigned) and the group
        has every input partition assigned."""
        try:
            for w in self.workers:
                w.process.wait_ready(lambda w=w: worker_ready(w.metrics_port), timeout)
            wanted = len(self.topics.inputs()) * self.settings.partitions
            live = [w for w in self.workers if w.process.alive()]
            if live:
                live[0].process.wait_ready(lambda: self.assigned_partitions() >= wanted, timeout)
        except ServiceError:
            asked = dump_stacks([w.process for w in self.workers])  # where a worker that is not ready waits
            if asked:
                _log.warning("workers not ready: their stacks are in their logs", extra={
                    "workers": asked, "logs": str(logs_dir(self.settings))})
            raise

    def assigned_partitions(self) -> int:
        return int(sum(v for k, v in self.scrape().items() if k.startswith("modpipe_assigned_partitions")))

    # -- supervision
    def components(self) -> dict[str, tuple]:
        """name -> (alive?, restart) of every child this stack started."""
        out: dict[str, tuple] = {}
        if self.broker is not None:
            out.update(self.broker.components())
        if self.triton is not None:
            out["triton"] = (lambda: self.triton.process is not None and self.triton.process.alive(),
                             self._restart_triton)
        for i, w in enumerate(self.workers):
            out[w.name] = (w.process.alive, lambda i=i: self._restart_worker(i))
        return out

    def _restart_triton(self) -> None:
        self.triton.stop()  # its python-backend stubs go with the process group
        self.triton.start()

    def _restart_worker(self, index: int) -> None:
        self.workers[index].stop()
        self.start_worker(index)

    def supervise(self, now: float | None = None) -> list[str]:
        """Restart every child that died and whose backoff is over; returns what happened, for the log."""
        now = time.monotonic() if now is None else now
        events = []
        for name, (alive, restart) in self.components().items():
            policy = self.restarts.setdefault(name, Restarts(started_at=now))
            if alive():
                continue
            if policy.next_at is None:
                due = policy.died(now)
                events.append(f"{name} died; restarting in {due - now:.0f} s")
                _log.warning("component died", extra={"component": name, "restart_in_s": round(due - now, 1),
                                                       "deaths_in_a_row": policy.failures})
            if not policy.due(now):
                continue
            try:
                restart()
            except Exception as exc:  # noqa: BLE001 - a failed restart is retried after a longer backoff
                policy.next_at = None
                due = policy.died(time.monotonic())
                events.append(f"{name} did not start ({exc}); next try in {due - time.monotonic():.0f} s")
                _log.error("restart failed", extra={"component": name, "error": str(exc)[:500]})
                continue
            policy.restarted(time.monotonic())
            events.append(f"{name} restarted ({policy.total} so far)")
            _log.info("component restarted", extra={"component": name, "restarts": policy.total})
        return events

    def process_groups(self) -> dict[str, int]:
        """name -> process group id of each live child (each runs in a session of its own)."""
        out = {}
        brokers = self.broker.processes().items() if self.broker is not None else ()
        for name, proc in (*brokers, ("triton", self.triton and self.triton.process),
                           *((w.name, w.process) for w in self.workers)):
            if proc is not None and proc.alive():
                out[name] = proc.pid
        return out

    def component_states(self) -> dict[str, str]:
        """name -> up | down (restarting in N s), for the status line."""
        now = time.monotonic()
        states = {}
        for name, (alive, _) in self.components().items():
            policy = self.restarts.get(name)
            if alive():
                states[name] = "up" if not policy or not policy.total else f"up ({policy.total} restarts)"
            elif policy and policy.next_at is not None:
                states[name] = f"down (restart in {max(0.0, policy.next_at - now):.0f} s)"
            else:
                states[name] = "down"
        return states

    def stop(self) -> None:
        self.killed_at_stop = []
        for w in self.workers:
            running = w.process.alive()
            if w.stop() == -signal.SIGKILL and running:  # not one a test had SIGKILLed already
                self.killed_at_stop.append(w.name)
        if self.triton is not None:
            self.triton.stop()
        if self.broker is not None:
            self.broker.stop()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- observation
    @staticmethod
    def scrape_worker(worker: WorkerProcess) -> dict[str, float]:
        """One worker's samples: {'name{labels}': value}; empty when it does not answer."""
        samples: dict[str, float] = {}
        with contextlib.suppress(OSError):
            text = urllib.request.urlopen(worker.metrics_url, timeout=1).read().decode()
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                    samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return samples

    def scrape(self) -> dict[str, float]:
        """Each sample summed over workers."""
        totals: dict[str, float] = {}
        for w in self.workers:
            for key, value in self.scrape_worker(w).items():
                totals[key] = totals.get(key, 0.0) + value
        return totals

    def group_lag(self, per_partition: dict | None = None) -> int | None:
        """Records of the input topics the consumer group has not committed yet (modpipe/services/group_lag.py
        says why that is read, not subtracted)."""
        from modpipe.services.group_lag import uncommitted_input

        try:
            return uncommitted_input(self.settings, self.bootstrap, self.topics.inputs(), per_partition=per_partition)
        except Exception:  # noqa: BLE001 - a status line must not crash the stack
            return None


def worker_port(base: int, index: int) -> int:
    """Worker `index` listens on base + index, or on a free port when another process holds that one.

    A worker whose port is taken dies at start (its metrics server); ports next to
    a free base port are often taken by the ephemeral ports of client connections. The status line and
    `LocalStack.workers` carry the port actually used."""
    port = base + index
    if index == 0 or port_free(port):
        return port
    chosen = free_port()
    _log.warning("worker port taken, using a free one", extra={"wanted": port, "port": chosen})
    return chosen


def histogram_quantile(samples: dict[str, float], name: str, q: float) -> float | None:
    """Quantile from cumulative `_bucket` samples (linear inside the bucket, like PromQL)."""
    buckets = sorted(((float(k.split("le=")[1].rstrip("}")), v) for k, v in samples.items()
                      if k.startswith(f"{name}_bucket{{") and "le=" in k), key=lambda b: b[0])
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            width = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / width if width else 0)
        prev_le, prev_count = le, count
    return prev_le


@dataclass
class StatusLine:
    """posts/s, decisions/s, lag, p50/p99 end-to-end latency and dead letters, from the workers' metrics."""

    last: dict[str, float] = field(default_factory=dict)
    last_t: float = field(default_factory=time.monotonic)

    def render(self, stack: LocalStack) -> str:
        now, cur = time.monotonic(), stack.scrape()
        dt = max(now - self.last_t, 1e-6)

        def total(prefix: str, sample: dict) -> float:
            return sum(v for k, v in sample.items() if k == prefix or k.startswith(prefix + "{"))

        posts = total("modpipe_posts_consumed_total", cur)
        decisions = total("modpipe_decisions_total", cur)
        rate_p = (posts - total("modpipe_posts_consumed_total", self.last)) / dt
        rate_d = (decisions - total("modpipe_decisions_total", self.last)) / dt
        self.last, self.last_t = cur, now
        p50 = histogram_quantile(cur, "modpipe_end_to_end_latency_seconds", 0.5)
        p99 = histogram_quantile(cur, "modpipe_end_to_end_latency_seconds", 0.99)
        lag = stack.group_lag()

        def ms(v):
            return "-" if v is None else f"{v * 1000:.0f}ms"

        states = stack.component_states()
        services = " | ".join(f"{name} {state}" for name, state in states.items() if not name.startswith("worker-"))
        down = {name: state for name, state in states.items() if name.startswith("worker-") and state != "up"}
        restarts = sum(p.total for name, p in stack.restarts.items() if name.startswith("worker-"))
        return (f"posts {posts:.0f} ({rate_p:.0f}/s) | decisions {decisions:.0f} ({rate_d:.0f}/s) | "
                f"lag {'-' if lag is None else lag} | p50 {ms(p50)} p99 {ms(p99)} | "
                f"dead letters {total('modpipe_dead_letters_total', cur):.0f} | "
                + (f"{services} | " if services else "")
                + f"workers {sum(w.process.alive() for w in stack.workers)}/{len(stack.workers)}"
                + (f" ({restarts} restarts)" if restarts else "")
                + "".join(f" | {name} {state}" for name, state in down.items() if "restart" in state))


def logs_dir(settings: Settings) -> Path:
    return settings.state_dir / "logs"


def dump_stacks(processes: Iterable, wait_s: float = 2.0) -> list[str]:
    """Ask each live worker process for its threads' and tasks' stacks (`modpipe.log.STACK_DUMP_SIGNAL`); they
    land in its log. Returns the names of those asked."""
    asked = [p for p in processes if p.alive()]
    for p in asked:
        p.signal(log.STACK_DUMP_SIGNAL)
    if asked:
        time.sleep(wait_s)  # the dump is written by the process itself
    return [p.name for p in asked]
