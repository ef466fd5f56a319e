"""loadgen/bench/profiling.py: py-spy's collapsed stacks read back (pure), and py-spy itself on a live process."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from modpipe.loadgen.bench.profiling import WorkerProfiler, frame_name, summarize

LOOP = ("thread (7): MainThread;<module> (modpipe/__main__.py:5);BaseEventLoop.run_forever (asyncio/base_events.py:608);"
        "BaseEventLoop._run_once (asyncio/base_events.py:1936)")
RAW = "\n".join([
    f"{LOOP};EpollSelector.select (selectors.py:468) 50",  # the loop idle: not its work
    f"{LOOP};Handle._run (asyncio/events.py:84);TextScorer.spam_probabilities (streams/moderation/scoring.py:120);"
    "BatchTokenizer.normalize (modpipe/textmodel/tokenize.py:90) 30",
    f"{LOOP};Handle._run (asyncio/events.py:84);TextScorer.spam_probabilities (streams/moderation/scoring.py:131) 10",
    f"{LOOP};Handle._run (asyncio/events.py:84);Stage.apply (streams/moderation/stages.py:200) 10",
    f"{LOOP};deque.popleft (<builtin>) 5",  # the loop's own bookkeeping between callbacks
    "thread (9): group-consumer;Thread.run (threading.py:982);GroupConsumer._run (streams/kafka/consumer.py:289) 70",
    "not a stack line",
])


def test_frame_names_drop_lines_and_directories():
    assert frame_name("Stage.apply (streams/moderation/stages.py:200)") == "Stage.apply (stages.py)"
    assert frame_name("_run_code (<frozen runpy>:88)") == "_run_code (<frozen runpy>)"
    assert frame_name("odd frame") == "odd frame"


def test_summary_counts_the_main_threads_work_once_per_stack():
    s = summarize(RAW)
    assert s["samples"] == 175 and s["main_thread_busy_samples"] == 55  # idle loop and other threads left out
    top = dict(s["top"])
    assert top["TextScorer.spam_probabilities (scoring.py)"] == round(40 / 55, 3)  # two lines, counted once each
    assert top["BatchTokenizer.normalize (tokenize.py)"] == round(30 / 55, 3)
    assert top["Stage.apply (stages.py)"] == round(10 / 55, 3) and top["deque.popleft (<builtin>)"] == round(5 / 55, 3)
    # the loop's machinery (its run, the dispatch of a callback) is not its work
    assert not {"Handle._run (events.py)", "BaseEventLoop.run_forever (base_events.py)",
                "BaseEventLoop._run_once (base_events.py)", "<module> (__main__.py)"} & set(top)
    assert [share for _, share in s["top"]] == sorted(top.values(), reverse=True)
    # one sample is enough to say where it was
    assert dict(summarize(RAW.splitlines()[2].rsplit(" ", 1)[0] + " 1")["top"]) == {
        "TextScorer.spam_probabilities (scoring.py)": 1.0}
    assert summarize("")["top"] == [] and summarize("")["main_thread_busy_samples"] == 0
    # a process that never imported threading has unnamed threads: its main thread's id is its pid
    unnamed = "thread (42);<module> (<string>:7);spin (<string>:6) 5\nthread (43);run (x.py:1) 7"
    assert summarize(unnamed)["main_thread_busy_samples"] == 0
    assert summarize(unnamed, pid=42)["main_thread_busy_samples"] == 5


BUSY = textwrap.dedent("""
    import time
    def hot_a():
        return sum(i * i for i in range(20000))
    def hot_b():
        return sorted(range(20000), key=lambda x: -x)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        hot_a()
        hot_b()
""")


def test_py_spy_records_a_live_process_and_names_its_hot_function(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        profiler = WorkerProfiler({"worker-0": child.pid}, tmp_path).start()
        time.sleep(2.0)
        out = profiler.stop()["worker-0"]
    finally:
        child.kill()
        child.wait()
    assert "error" not in out, out
    assert out["main_thread_busy_samples"] > 20 and (tmp_path / "worker-0.txt").exists()
    top = dict(out["top"])
    assert "hot_a (<string>)" in top and "hot_b (<string>)" in top  # the two functions the process spins in


def test_a_profiler_that_cannot_run_says_so(tmp_path):
    missing = WorkerProfiler({"worker-0": 1}, tmp_path)
    missing.py_spy = None
    assert "not installed" in missing.start().stop()["worker-0"]["error"]
    gone = WorkerProfiler({"worker-0": 2 ** 22 + 7}, tmp_path / "gone").start()  # no such process
    assert "py-spy wrote nothing" in gone.stop()["worker-0"]["error"]
