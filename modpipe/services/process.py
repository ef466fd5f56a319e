"""A child process we own: started in its own process group, health-checked, stopped with no orphans."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from modpipe import log

_log = log.get(__name__)


class ServiceError(RuntimeError):
    """A service failed to start or to become ready."""


_handed_out: set[int] = set()  # ports free_port returned in this process
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SPACING = 16  # room above each port for the local stack's base + index worker ports


def _listen_range() -> tuple[int, int]:
    """Ports the kernel never gives an outgoing connection: those below its ephemeral range.

    A listener on an ephemeral port can lose it between our check and its bind to any client
    connection (Kafka clients open many); a worker died of EADDRINUSE that way in CI."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default; macOS's range starts higher still
    return 10000, low - _SPACING


def _kernel_port(host: str) -> int:
    """A port the kernel offers for bind(0): used where no range below the ephemeral one is left."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise ServiceError(f"no free port on {host} that was not handed out already")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, below the kernel's ephemeral range, and never one this process was
    given before or just below: once a probing socket is closed the kernel may hand out the same port
    again (a Triton given it for both HTTP and gRPC does not start), and base + index ports must not
    run into the next one handed out."""
    low, high = _listen_range()
    if high <= low:
        return _kernel_port(host)
    for _ in range(1000):
        port = random.randrange(low, high)
        if any(abs(port - given) < _SPACING for given in _handed_out):
            continue
        if port_free(port, host):
            _handed_out.add(port)
            return port
    raise ServiceError(f"no free port on {host} in {low}-{high} that was not handed out already")


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when `port` can be bound now (nothing listens on it and no connection holds it)."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
DUMP_WAIT_S = 2.0  # how long a process that hung at stop gets to write its stacks before SIGKILL


def _stop_with(parent: int) -> Callable[[], None] | None:
    """A pre-exec hook that has the kernel SIGTERM the child when `parent` dies, SIGKILL included.

    Children run in their own session (so that stop() reaches their whole group), which also takes
    them out of reach of a terminal's Ctrl-C; without this a killed `modpipe up` leaves its broker,
    Triton and workers running and holding their ports. The kernel sends the signal when the thread
    that forked exits, so only children started from the main thread get it (an executor thread that
    restarts a broker would take the broker with it when the pool winds down). Linux only."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    # looked up here, not in the child: dlsym takes the loader's lock, which another thread may hold at fork
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes, prctl.restype = [ctypes.c_int, ctypes.c_ulong], ctypes.c_int
    pdeathsig, sigterm = _PR_SET_PDEATHSIG, int(signal.SIGTERM)

    def hook() -> None:  # runs in the child between fork and exec: no locks, no imports
        prctl(pdeathsig, sigterm)
        if os.getppid() != parent:  # the parent died before the line above
            os.kill(os.getpid(), signal.SIGTERM)

    return hook


class ManagedProcess:
    """Runs `argv` in a new session so that stopping it also stops everything it spawned."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        logf = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed in stop()
        self._logf = logf
        self.proc = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT, env=self.env,
                                     cwd=self.cwd, start_new_session=True, preexec_fn=_stop_with(os.getpid()))
        _log.info("started", extra={"service": self.name, "pid": self.proc.pid, "log": str(self.log_path)})
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, check: Callable[[], bool], timeout: float, interval: float = 0.1) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise ServiceError(f"{self.name} exited with code {self.proc.returncode}; "
                                   f"last log lines:\n{self.tail()}")
            try:
                if check():
                    return
            except Exception:  # noqa: BLE001 - any failure of the probe means "not yet"
                pass
            time.sleep(interval)
        self.stop()
        raise ServiceError(f"{self.name} not ready after {timeout:.0f}s; last log lines:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def stop(self, timeout: float = 10.0, dump_signal: int | None = None) -> int | None:
        """SIGTERM the whole group, SIGKILL whatever is left after `timeout`. A process that answers
        `dump_signal` with its stacks (the workers) is sent it first, so its log says where it hung."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _log.warning("did not stop in time, killing", extra={"service": self.name, "timeout_s": timeout,
                                                                      "log": str(self.log_path)})
                if dump_signal is not None:
                    self.signal(dump_signal)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.proc.wait(DUMP_WAIT_S)  # the process writes its own dump
        # Children may outlive the leader; the group id is the leader's pid.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        getattr(self, "_logf", None) and self._logf.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would: used by tests that prove recovery."""
        self.signal(signal.SIGKILL)
        if self.proc:
            self.proc.wait()

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def clock_tick() -> int:
    """Clock ticks per second of /proc's CPU times."""
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError, AttributeError):
        return 100


def group_cpu_seconds(groups: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) of the live processes of each process group {name: pgid}."""
    by_pgid = {pgid: name for name, pgid in groups.items() if pgid}
    out = dict.fromkeys(groups, 0.0)
    tick = clock_tick()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    data = f.read()
            except OSError:
                continue
            rest = data[data.rindex(")") + 2:].split()  # state ppid pgrp ... utime(11) stime(12)
            name = by_pgid.get(int(rest[2]))
            if name is not None:
                out[name] += (int(rest[11]) + int(rest[12])) / tick
    return out
