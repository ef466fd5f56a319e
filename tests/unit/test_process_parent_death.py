"""A managed child stops when the process that started it is SIGKILLed (no orphaned broker, Triton or worker)."""

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from modpipe.services.process import ManagedProcess

ROOT = Path(__file__).resolve().parents[2]
PARENT = """
import sys, time
from pathlib import Path
from modpipe.services.process import ManagedProcess
child = ManagedProcess("sleeper", [sys.executable, "-c", "import time; time.sleep(120)"], Path(sys.argv[1])).start()
print(child.pid, flush=True)
time.sleep(120)
"""


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for a reaper (a container's init may never reap it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    return fields[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_child_stops_when_its_parent_is_killed(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path / "sleeper.log")], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        time.sleep(0.5)
        assert running(child), "the child should run while its parent does"
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(child), "the child outlived its SIGKILLed parent"
    finally:
        parent.kill()


def test_a_child_started_from_another_thread_outlives_that_thread(tmp_path):
    """The kernel would stop it when the forking thread exits: an executor thread that restarted a broker."""
    started = []
    thread = threading.Thread(target=lambda: started.append(ManagedProcess(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(120)"], tmp_path / "sleeper.log").start()))
    thread.start()
    thread.join()
    try:
        time.sleep(1)
        assert started[0].alive()
    finally:
        started[0].stop()
