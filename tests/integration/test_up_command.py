"""`modpipe up` in the foreground: ready line, status lines, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modpipe.services.process import free_port

pytestmark = pytest.mark.integration


def descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_up_starts_everything_and_ctrl_c_stops_it_all(tmp_path, triton_env):
    env = {**triton_env, "MODPIPE_STATE_DIR": str(tmp_path), "MODPIPE_BROKER_PORT": str(free_port()),
           "MODPIPE_METRICS_PORT": str(free_port()), "MODPIPE_WEB_PORT": str(free_port()),
           "MODPIPE_TABLE_STORE": "memory", "PYTHONUNBUFFERED": "1"}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    proc = subprocess.Popen([sys.executable, "-m", "modpipe", "up", "--workers", "1", "--interval", "1"],
                            env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and not any(line.startswith("posts ") for line in lines):
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
        assert any(line.startswith("ready: KAFKA_BOOTSTRAP_SERVERS=") for line in lines), "".join(lines[-20:])
        status = next(line for line in lines if line.startswith("posts "))
        for field in ("decisions", "lag", "p50", "p99", "dead letters", "workers 1/1"):
            assert field in status, status
        children = descendants(proc.pid)
        assert len(children) >= 2, "broker and worker should be running"
        proc.send_signal(signal.SIGINT)
        # keep reading: the workers' shutdown logs share this pipe, and a full pipe would block their exit
        try:
            _, rest = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, rest = proc.communicate()
            pytest.fail(f"'up' did not stop within 90 s of Ctrl-C; its last output:\n{rest[-3000:]}")
        assert proc.returncode == 0, rest[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.5)
    left = [pid for pid in children if alive(pid)]
    assert not left, f"processes left behind after Ctrl-C: {left}"
