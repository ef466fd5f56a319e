"""`modpipe up` in the foreground: ready line, status lines, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modpipe import log
from modpipe.services.process import free_port
from modpipe.settings import Settings

pytestmark = pytest.mark.integration

EMBEDDED = Settings.from_env().broker == "embedded"


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
           "MODPIPE_METRICS_PORT": str(free_port()),
           "PYTHONUNBUFFERED": "1"}
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
        assert proc.returncode == 130, rest[-3000:]  # 128 + SIGINT, as every command
    finally:
        if proc.poll() is None:
            proc.kill()
    time.sleep(0.5)
    left = [pid for pid in children if alive(pid)]
    assert not left, f"processes left behind after Ctrl-C: {left}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _child(root: int, needle: str) -> int:
    """The live descendant of `root` whose command line contains `needle` (the group leader: lowest pid)."""
    pids = sorted(p for p in descendants(root) if needle in _cmdline(p) and alive(p))
    assert pids, f"no child running {needle!r}"
    return pids[0]


def test_up_restarts_what_dies_and_keeps_deciding(tmp_path, settings_env, model_build):
    """Issue #14: a SIGKILLed Triton, worker or broker (node) is restarted by `up`, and posts are decided
    afterwards."""
    import threading

    from modpipe.loadgen.posts import make_post
    from modpipe.loadgen.smoke import end_consumer

    from modpipe import schema
    from modpipe.settings import Settings

    broker_port = free_port()
    env = {**settings_env, "MODPIPE_STATE_DIR": str(tmp_path), "MODPIPE_BROKER_PORT": str(broker_port),
           "MODPIPE_METRICS_PORT": str(free_port()), "TRITON_URL": "",
           "TRITON_HTTP_PORT": str(free_port()), "TRITON_GRPC_PORT": str(free_port()),
           "TRITON_METRICS_PORT": str(free_port()), "MODPIPE_MODEL_DIR": str(model_build.path),
           "PYTHONUNBUFFERED": "1"}
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    proc = subprocess.Popen([sys.executable, "-m", "modpipe", "up", "--workers", "1", "--interval", "1"],
                            env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()

    def wait_for(predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if proc.poll() is not None:
                break
            time.sleep(0.5)
        pytest.fail(f"{what} not seen within {timeout:.0f} s; last output:\n{''.join(lines[-30:])}")

    try:
        wait_for(lambda: any(line.startswith("posts ") for line in lines), 180, "a status line")
        status = next(line for line in lines if line.startswith("posts "))
        broker, broker_needle = ("broker", "noida") if EMBEDDED else ("kafka-1", "kafka.Kafka")
        assert f"{broker} up" in status and "triton up" in status and "workers 1/1" in status, status
        for name, needle in (("triton", "bin/tritonserver"), ("worker-0", "modpipe worker"), (broker, broker_needle)):
            victim = _child(proc.pid, needle)
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda name=name: any(f"{name} restarted" in line for line in lines), 180, f"{name} restarted")
            assert _child(proc.pid, needle) != victim
        wait_for(lambda: any(line.startswith("posts ") and "workers 1/1" in line and f"{broker} up (1 restarts)" in line
                             and "triton up (1 restarts)" in line for line in lines[-3:]), 60, "every component up")

        settings = Settings.from_env({**env, "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{broker_port}"})
        consumer = end_consumer(settings, settings.bootstrap_servers, [settings.topic("decisions")])
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
        import random

        rng = random.Random(5)
        wanted = set()
        for i in range(20):
            post = make_post(rng, f"after-restarts-{i}", "see you at the match tonight", user_id=f"u{i % 3}")
            wanted.add(post["post_id"])
            producer.produce(settings.topic("posts"), key=post["user_id"].encode(), value=schema.dumps(post))
        assert producer.flush(30) == 0
        got: set[str] = set()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not wanted <= got:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.add(schema.decode_decision(msg.value())["post_id"])
        consumer.close()
        assert wanted <= got, f"{len(wanted - got)} of 20 posts undecided after the restarts"
        children = descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.send_signal(log.STACK_DUMP_SIGNAL)  # its threads' stacks, into the output read below
            time.sleep(2)
            worker_log = tmp_path / "logs" / "worker-0.log"
            tail = worker_log.read_text().splitlines()[-15:] if worker_log.exists() else []
            pytest.fail("`modpipe up` did not stop within 90 s of Ctrl-C; its last output (stacks included):\n"
                        + "".join(lines[-80:]) + "\nworker-0.log:\n" + "\n".join(tail))
        assert proc.returncode == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.5)
    assert not [pid for pid in children if alive(pid)], "processes left behind after Ctrl-C"
