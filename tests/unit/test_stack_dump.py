"""`kill -USR1` on a worker (modpipe.log): every thread's stack, also of a thread stuck in a call that never
returns to Python, and every asyncio task's chain of awaits, from one signal; and how the local stack and the
chaos run ask for it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from modpipe.streams.local.stack import dump_stacks

from modpipe import log
from modpipe.services.process import ServiceError

ROOT = Path(__file__).resolve().parents[2]

# A process that parks a task in a coroutine of its own, then blocks its event loop in a sleep (what a
# call into C that does not return looks like from Python). It says on stdout when each phase starts.
PROBE = """
import asyncio, sys, time
from modpipe import log
log.configure("INFO", "json")
log.dump_stacks_on_signal()

async def parked(event):
    await event.wait()

def stuck_in_a_call():
    print("blocked", flush=True)
    time.sleep(4)

async def main():
    log.dump_tasks_on_signal(asyncio.get_running_loop())
    event = asyncio.Event()
    waiter = asyncio.create_task(parked(event), name="waiter")
    print("running", flush=True)
    await asyncio.sleep(1.5)
    stuck_in_a_call()
    event.set()
    await waiter
    print("done", flush=True)

asyncio.run(main())
"""


def test_one_signal_dumps_threads_and_tasks_also_while_the_loop_is_blocked():
    proc = subprocess.Popen([sys.executable, "-c", PROBE], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "running"
        os.kill(proc.pid, log.STACK_DUMP_SIGNAL)
        assert proc.stdout.readline().strip() == "blocked"
        time.sleep(0.5)  # inside the 4 s sleep: only faulthandler can answer now
        os.kill(proc.pid, log.STACK_DUMP_SIGNAL)
        assert proc.stdout.readline().strip() == "done"  # the signals did not stop it
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    err = proc.stderr.read()
    dumps = err.split("most recent call first")
    assert len(dumps) >= 3, err  # two thread dumps at least
    assert any("in stuck_in_a_call" in d for d in dumps), err  # the blocked loop's thread, caught in the act
    records = [json.loads(ln) for ln in err.splitlines() if ln.startswith("{")]
    task_dumps = [r for r in records if r["msg"] == "stack dump: asyncio tasks"]
    # the task dump of the blocked phase runs once the loop is back; the first one ran at once
    assert len(task_dumps) == 2, err
    waiter = [t for t in task_dumps[0]["tasks"] if t["task"] == "waiter"]
    assert waiter and waiter[0]["awaiting"][0].endswith("in parked"), task_dumps[0]
    assert waiter[0]["awaiting"][-1].endswith("in wait"), waiter  # asyncio.Event.wait, innermost


# A process whose loop stops answering the signal before it closes, as the worker's does at the end.
AFTER_THE_LOOP = """
import asyncio, time
from modpipe import log
log.dump_stacks_on_signal()

async def main():
    log.dump_tasks_on_signal(asyncio.get_running_loop())
    log.stop_dumping_tasks(asyncio.get_running_loop())

asyncio.run(main())
print("closed", flush=True)
time.sleep(1.5)
print("done", flush=True)
"""


def test_after_the_loop_has_closed_the_signal_still_dumps_stacks_and_does_not_kill():
    proc = subprocess.Popen([sys.executable, "-c", AFTER_THE_LOOP], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "closed"
        os.kill(proc.pid, log.STACK_DUMP_SIGNAL)
        assert proc.stdout.readline().strip() == "done", proc.stderr.read()  # without it: killed by the signal
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    assert "most recent call first" in proc.stderr.read()


def test_await_chain_lists_each_awaiting_coroutine_innermost_last():
    async def inner(fut):
        await fut

    async def outer(fut):
        await inner(fut)

    async def main():
        fut = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(outer(fut))
        await asyncio.sleep(0)
        chain = log.await_chain(task.get_coro())
        fut.set_result(None)
        await task
        return chain

    chain = asyncio.run(main())
    assert [c.rsplit(" in ", 1)[1] for c in chain[:2]] == ["outer", "inner"], chain
    assert chain[0].startswith(__file__), chain
    assert len(chain) == 2, chain  # the future `inner` awaits adds no frame


class FakeProcess:
    def __init__(self, name: str, alive: bool):
        self.name, self._alive, self.signals = name, alive, []

    def alive(self) -> bool:
        return self._alive

    def signal(self, sig: int) -> None:
        self.signals.append(sig)


def test_only_live_workers_are_asked_for_their_stacks():
    live, dead = FakeProcess("worker-0", True), FakeProcess("worker-1", False)
    assert dump_stacks([live, dead], wait_s=0) == ["worker-0"]
    assert live.signals == [log.STACK_DUMP_SIGNAL] and dead.signals == []
    assert dump_stacks([dead], wait_s=0) == []


class NeverReady(FakeProcess):
    def wait_ready(self, check, timeout):
        raise ServiceError(f"{self.name} not ready after {timeout} s")


def test_a_stack_whose_workers_are_not_ready_asks_them_for_their_stacks_before_it_gives_up(monkeypatch):
    from modpipe.streams.local import stack as stack_module

    from modpipe.settings import Settings

    monkeypatch.setattr(stack_module.time, "sleep", lambda s: None)
    stack = stack_module.LocalStack(Settings.from_env({}), workers=2)
    live, dead = NeverReady("worker-0", True), NeverReady("worker-1", False)
    stack.workers = [stack_module.WorkerProcess(p.name, 0, p) for p in (live, dead)]
    with pytest.raises(ServiceError, match="worker-0 not ready"):
        stack.wait_workers_ready(timeout=1)
    assert live.signals == [log.STACK_DUMP_SIGNAL] and dead.signals == []


# A process that ignores SIGTERM (a worker hung in its shutdown) and answers the dump signal.
DEAF_TO_SIGTERM = """
import signal, sys, time
from modpipe import log
signal.signal(signal.SIGTERM, signal.SIG_IGN)
log.dump_stacks_on_signal()

def hung_in_shutdown():
    print("up", flush=True)
    time.sleep(60)

hung_in_shutdown()
"""


def test_a_worker_that_does_not_stop_in_time_writes_its_stacks_before_it_is_killed(tmp_path):
    from modpipe.streams.local.stack import WorkerProcess

    from modpipe.services.process import ManagedProcess

    log_path = tmp_path / "worker.log"
    proc = ManagedProcess("deaf", [sys.executable, "-c", DEAF_TO_SIGTERM], log_path, cwd=ROOT).start()
    deadline = time.monotonic() + 20
    while "up" not in log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    rc = WorkerProcess("deaf", 0, proc).stop(timeout=1.0)
    assert rc == -9  # SIGTERM was ignored: it had to be killed
    assert time.monotonic() - started < 10
    text = log_path.read_text()
    assert "in hung_in_shutdown" in text, text  # faulthandler's dump names the function it hung in
