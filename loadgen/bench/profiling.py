"""py-spy on the workers during a saturation pass: where each worker's event loop goes per post.

A saturated worker is bounded by its event loop (one thread, under the GIL) long before Triton is busy on a
GPU (docs/benchmarks.md, One GPU). `WorkerProfiler` samples every worker with `py-spy record --format raw`
for the length of the pass; `summarize` reads the collapsed stacks back: of the main thread's samples, the
ones outside the event loop's selector wait are the loop at work, and each function's share of those
(counted once per stack it appears in) says where that work went.

py-spy attaches with ptrace: it needs root or CAP_SYS_PTRACE (a container adds it with `--cap-add
SYS_PTRACE`). A profiler that cannot attach is reported as such; it never fails the benchmark. It samples without
stopping the worker (`--nonblocking`), at 100 Hz by default, and still costs the worker some speed: the pass
it profiles is not the one to read saturation from.
"""

from __future__ import annotations

import collections
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

MAIN_THREAD = "MainThread"
# The event loop waiting for I/O: the loop is idle in these samples.
IDLE_FRAMES = ("EpollSelector.select (", "PollSelector.select (", "SelectSelector.select (")
_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^():]+)(?::\d+)?\)$")
TOP = 15


def frame_name(frame: str) -> str:
    """`Stage.apply (streams/moderation/stages.py:120)` -> `Stage.apply (stages.py)`: one name per function."""
    m = _FRAME.match(frame)
    return f"{m['func']} ({m['file'].rsplit('/', 1)[-1]})" if m else frame


def is_main_thread(label: str, pid: int | None = None) -> bool:
    """`thread (1234): MainThread`, or `thread (1234)` (no name: `threading` never imported) whose id is the
    process's own (Linux: the main thread's id is the pid)."""
    m = re.match(r"thread \((\d+)\)(?::\s*(.*))?$", label)
    if not m:
        return False
    return m[2] == MAIN_THREAD or (pid is not None and int(m[1]) == pid)


def loop_work(frames: list[str]) -> list[str]:
    """The frames below the event loop's dispatch of a callback or task step (`Handle._run`), or below
    `_run_once` for the loop's own bookkeeping: the work, without the loop's machinery. A main thread that
    runs no event loop: every frame."""
    for marker in ("Handle._run (", "BaseEventLoop._run_once ("):
        at = [i for i, f in enumerate(frames) if f.startswith(marker)]
        if at:
            return frames[at[-1] + 1:]
    return frames


def summarize(raw: str, top: int = TOP, pid: int | None = None) -> dict:
    """The main thread's busy samples and the functions their work went through (each counted once per
    sample), from `py-spy --format raw` output recorded with `--threads` (each line: `thread (tid):
    name;frame;...;frame count`)."""
    samples = busy = 0
    through: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        thread, *frames = stack.split(";")
        if not is_main_thread(thread, pid) or any(f.startswith(IDLE_FRAMES) for f in frames):
            continue
        busy += n
        for name in {frame_name(f) for f in loop_work(frames)}:
            through[name] += n
    shares = [(name, round(n / busy, 3)) for name, n in through.most_common()] if busy else []
    return {"samples": samples, "main_thread_busy_samples": busy, "top": shares[:top]}


def find_py_spy() -> str | None:
    """py-spy on PATH, or beside this interpreter (a virtualenv's bin/ run without being activated)."""
    beside = Path(sys.executable).with_name("py-spy")
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


class WorkerProfiler:
    """`py-spy record` on each of `pids` ({name: pid}) from `start()` to `stop()`; raw stacks go to
    `out_dir/<name>.txt`."""

    def __init__(self, pids: dict[str, int], out_dir: Path, rate_hz: int = 100, py_spy: str | None = None):
        self.pids, self.out_dir, self.rate_hz = dict(pids), Path(out_dir), rate_hz
        self.py_spy = py_spy or find_py_spy()
        self._procs: dict[str, subprocess.Popen] = {}

    def start(self) -> WorkerProfiler:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if self.py_spy is None:
            return self
        for name, pid in self.pids.items():
            log = open(self.out_dir / f"{name}.py-spy.log", "w")  # noqa: SIM115 - closed with the process
            self._procs[name] = subprocess.Popen(
                [self.py_spy, "record", "-p", str(pid), "-r", str(self.rate_hz), "--threads", "--nonblocking",
                 "--format", "raw", "-o", str(self.out_dir / f"{name}.txt")], stdout=log, stderr=subprocess.STDOUT)
        return self

    def stop(self, timeout_s: float = 30.0) -> dict:
        """{name: summary} per worker, or {name: {"error": ...}} where py-spy did not record."""
        if self.py_spy is None:
            return {name: {"error": "py-spy is not installed (pip install py-spy)"} for name in self.pids}
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        out = {}
        for name, proc in self._procs.items():
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raw = self.out_dir / f"{name}.txt"
            log = self.out_dir / f"{name}.py-spy.log"
            if raw.exists() and raw.stat().st_size:
                out[name] = {**summarize(raw.read_text(), pid=self.pids[name]), "raw": str(raw)}
            else:
                said = log.read_text().strip().splitlines() if log.exists() else []
                out[name] = {"error": f"py-spy wrote nothing (rc {proc.returncode}): "
                                      f"{said[-1] if said else 'no output'}"}
        return out
