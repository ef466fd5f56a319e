"""What every command does alike: exit statuses on signals (130 after SIGINT, 143 after SIGTERM), `--json` as
machine output with a human rendering without it, and progress bars only on a terminal."""

from __future__ import annotations

import argparse
import ast
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from modpipe import cli, exits, output
from modpipe.services.process import free_port
from modpipe.settings import SETTINGS_SPEC

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("modpipe", "streams", "features", "simulation", "loadgen", "console")

# Commands that print data: each takes --json.
DATA_COMMANDS = {"config", "topics", "console list-moderators", "smoke", "fuzz", "chaos", "loadgen", "bench",
                 "bench features", "bench transport", "bench model", "classify", "model eval", "decision eval",
                 "decision train"}


# -- exit statuses on signals ------------------------------------------------------------------------------

def _spawn(script: str, *, ignore_sigint: bool = False, env: dict | None = None) -> subprocess.Popen:
    """`script` in a child Python with this tree first on its path; SIGINT ignored as a background job of a
    non-interactive shell inherits it, when asked."""
    def preexec():
        if ignore_sigint:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, preexec_fn=preexec,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen, marker: str, timeout: float = 180) -> None:
    """Read the child's stdout until `marker` (then it has installed what it installs before printing it)."""
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if marker in line:
            return
        lines.append(line)
        if not line and proc.poll() is not None:
            break
    proc.kill()
    pytest.fail(f"no {marker!r} from the child: {''.join(lines)}{proc.stderr.read()[-3000:]}")


def _stop(proc: subprocess.Popen, sig: int, timeout: float = 120) -> tuple[int, str]:
    """Signal the child, then read its output to the end (a child blocked on a full pipe would never exit)."""
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"did not stop within {timeout} s of {signal.Signals(sig).name}: {err[-3000:]}")
    return proc.returncode, err


# A command that only waits, run through modpipe.cli.main like every command.
WAITING_COMMAND = """
    import sys, time, types
    from modpipe import cli

    def register(sub):
        def wait(args):
            print("waiting", flush=True)
            time.sleep(120)
        sub.add_parser("wait").set_defaults(func=wait)

    sys.modules["waiting_command"] = types.SimpleNamespace(register=register)
    cli.COMMAND_MODULES = ["waiting_command"]
    sys.exit(cli.main(["wait"]))
"""


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.parametrize("ignore_sigint", [False, True], ids=["foreground", "sigint-inherited-ignored"])
def test_any_command_exits_128_plus_the_signal(sig, status, ignore_sigint):
    proc = _spawn(WAITING_COMMAND, ignore_sigint=ignore_sigint)
    _wait_for(proc, "waiting")
    rc, err = _stop(proc, sig)
    assert rc == status, err[-3000:]
    assert "Traceback" not in err


# `modpipe up` with the stack replaced by one that records that it was stopped: what is tested is the command's
# loop and its signal handling (the supervisor's `except Exception` guards must let the signal through).
UP_WITH_A_FAKE_STACK = """
    import sys
    import modpipe.streams.local.stack
    from modpipe import cli

    class Stack:
        bootstrap, triton_url, workers = "127.0.0.1:1", "127.0.0.1:2", []
        def __init__(self, settings, workers):
            pass
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            print("stack stopped", file=sys.stderr, flush=True)
        def supervise(self):
            print("supervising", flush=True)
            return []

    class StatusLine:
        def render(self, stack):
            return "posts 0/s"

    modpipe.streams.local.stack.LocalStack, modpipe.streams.local.stack.StatusLine = Stack, StatusLine
    sys.exit(cli.main(["up", "--interval", "0.05"]))
"""


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_up_stops_its_stack_and_exits_128_plus_the_signal(sig, status, tmp_path):
    proc = _spawn(UP_WITH_A_FAKE_STACK, env={"MODPIPE_STATE_DIR": str(tmp_path)})
    _wait_for(proc, "supervising")
    rc, err = _stop(proc, sig)
    assert rc == status and "stack stopped" in err and "stopped" in err.splitlines()[-1], err[-3000:]


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_the_broker_command_stops_gracefully_with_128_plus_the_signal(sig, status, tmp_path):
    """`modpipe broker` on the embedded broker (in-process, starts in seconds): a command with its own graceful
    stop returns the signal's status too."""
    proc = subprocess.Popen([sys.executable, "-m", "modpipe", "broker"], cwd=ROOT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "MODPIPE_BROKER": "embedded",
                                 "KAFKA_BOOTSTRAP_SERVERS": "", "MODPIPE_BROKER_PORT": str(free_port()),
                                 "MODPIPE_STATE_DIR": str(tmp_path)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = []
    deadline = time.monotonic() + 90
    while not any("broker ready" in line for line in lines):
        line = proc.stderr.readline()
        lines.append(line)
        if (not line and proc.poll() is not None) or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("".join(lines)[-3000:])
    rc, err = _stop(proc, sig)  # reads its stderr to the end: a full pipe would block its shutdown logs
    assert rc == status, err[-3000:]


def test_stop_on_signal_sets_the_event_and_keeps_the_first_signal():
    event = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        stop = exits.StopOnSignal(event).install()
        assert stop.status() == 0 and stop.status(1) == 1
        os.kill(os.getpid(), signal.SIGTERM)
        assert event.wait(5)
        os.kill(os.getpid(), signal.SIGINT)  # a second signal while stopping does not change the status
        time.sleep(0.1)
        assert stop.status() == 143 and stop.status(1) == 143
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_a_signal_that_lands_inside_the_events_wait_does_not_deadlock():
    """A signal.signal handler runs between two bytecodes of the main thread, which may then hold the event's lock
    (inside threading.Event.wait): the handler must not take that lock itself (`modpipe broker` once hung so)."""
    event = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}

    def hung(*_):
        raise TimeoutError("the handler waited for the lock its own thread holds")

    try:
        stop = exits.StopOnSignal(event).install()
        handler = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGALRM, hung)  # interrupts the lock's wait if the handler deadlocks
        signal.alarm(5)
        with event._cond:  # held as Event.wait holds it; the handler called as the interpreter would call it
            handler(signal.SIGTERM, None)
        signal.alarm(0)
        assert event.wait(5) and stop.status() == 143
    finally:
        signal.alarm(0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_status_of_the_signals_exceptions():
    assert exits.status_of(KeyboardInterrupt()) == 130 and exits.status_of(exits.Terminated()) == 143
    assert not issubclass(exits.Terminated, Exception)  # `except Exception` lets it through


# -- --json and the human rendering -------------------------------------------------------------------------

def leaf_commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                full = f"{prefix} {name}".strip()
                out[full] = sub
                out.update(leaf_commands(sub, full))
    return out


def test_every_command_that_prints_data_takes_json():
    commands = leaf_commands(cli.build_parser([]))
    with_json = {name for name, p in commands.items() if any("--json" in a.option_strings for a in p._actions)}
    assert DATA_COMMANDS <= set(commands), DATA_COMMANDS - set(commands)
    assert DATA_COMMANDS - with_json == set()
    for name in with_json:
        (action,) = [a for a in commands[name]._actions if "--json" in a.option_strings]
        assert action.help and "JSON" in action.help, name


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    rc = cli.main(argv)
    return rc, capsys.readouterr().out


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def test_config_prints_json_or_env_lines(capsys, monkeypatch):
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", "secret")
    rc, out = _run(capsys, ["config", "--json"])
    data = json.loads(out)
    assert rc == 0 and set(data) == {spec.env for spec in SETTINGS_SPEC.values()}
    assert data["KAFKA_SASL_PASSWORD"] == "***"
    rc, out = _run(capsys, ["config"])
    lines = out.splitlines()
    assert rc == 0 and not _is_json(out) and len(lines) == len(data)
    assert "KAFKA_SASL_PASSWORD=***" in lines and "secret" not in out


def test_topics_prints_json_or_a_table(capsys, monkeypatch):
    import modpipe.streams.moderation.topics

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("MODPIPE_PARTITIONS", "3")
    names = None

    def ensure(settings, bootstrap):
        nonlocal names
        names = modpipe.streams.moderation.topics.TopicNames.from_settings(settings).all()
        return {names[0]}

    monkeypatch.setattr(modpipe.streams.moderation.topics, "ensure_topics", ensure)
    rc, out = _run(capsys, ["topics", "--json"])
    rows = json.loads(out)
    assert rc == 0 and [r["topic"] for r in rows] == list(names)
    assert [r["state"] for r in rows] == ["created"] + ["exists"] * (len(names) - 1)
    assert {r["partitions"] for r in rows} == {3}
    rc, out = _run(capsys, ["topics"])
    assert rc == 0 and not _is_json(out) and out.splitlines()[0] == f"{names[0]}\tcreated\t3 partitions"


def test_list_moderators_prints_json_or_a_table(capsys, monkeypatch, tmp_path):
    from modpipe.console.auth import Accounts

    path = tmp_path / "accounts.json"
    monkeypatch.setenv("MODPIPE_CONSOLE_ACCOUNTS", str(path))
    accounts = Accounts(path)
    accounts.add("ana", "a long enough password 1", "moderator")
    accounts.add("bo", "a long enough password 2", "viewer")
    rc, out = _run(capsys, ["console", "list-moderators", "--json"])
    assert rc == 0 and sorted(json.loads(out), key=lambda r: r["name"]) == [
        {"name": "ana", "role": "moderator"}, {"name": "bo", "role": "viewer"}]
    rc, out = _run(capsys, ["console", "list-moderators"])
    assert rc == 0 and not _is_json(out) and sorted(out.splitlines()) == ["ana\tmoderator", "bo\tviewer"]


REPORT = {"sent": 200, "decided": 199, "lost": 1, "p99_ms": 41.25, "dlq_reasons_match": True,
          "dead_letters": {"invalid_json": 3, "too_large": 1}, "lag_after": 0, "dead_letter_reason_mismatches": 0,
          "valid_records_dead_lettered": 0}


@pytest.mark.parametrize("argv, module, function", [
    (["smoke", "--posts", "5"], "modpipe.loadgen.smoke", "smoke"),
    (["fuzz", "--records", "5"], "modpipe.loadgen.fuzz", "fuzz"),
    (["bench", "features", "--posts", "5", "--brokers", "kafka"], "modpipe.loadgen.bench_features", "run"),
])
def test_reports_are_json_with_json_and_a_rendering_without(capsys, monkeypatch, argv, module, function):
    import importlib

    calls = []

    def fake(*args, **kwargs):
        calls.append(kwargs.get("progress"))
        return dict(REPORT)

    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "")
    monkeypatch.setattr(importlib.import_module(module), function, fake)
    _, out = _run(capsys, argv + ["--json"])
    assert json.loads(out) == REPORT and out.count("\n") == 1
    _, out = _run(capsys, argv)
    assert not _is_json(out)
    lines = out.splitlines()
    assert any(line.split() == ["lost", "1"] for line in lines)
    assert any(line.split() == ["p99_ms", "41.25"] for line in lines)
    assert any(line.strip().split() == ["invalid_json", "3"] for line in lines)
    assert calls == [False, True]  # --json also turns the bars off


def test_decision_train_without_labels_prints_its_model_dir_as_json(capsys, monkeypatch, tmp_path):
    import modpipe.decision.train
    import modpipe.textmodel.artifacts

    progress = []

    def train(settings, model, **kwargs):
        progress.append(kwargs["progress"])
        return tmp_path / "decision-model"

    monkeypatch.setattr(modpipe.textmodel.artifacts, "resolve_model", lambda settings: None)
    monkeypatch.setattr(modpipe.decision.train, "train", train)
    assert _run(capsys, ["decision", "train", "--json"]) == (0, json.dumps({"model_dir": str(tmp_path / "decision-model")}) + "\n")
    assert _run(capsys, ["decision", "train"]) == (0, f"{tmp_path / 'decision-model'}\n")
    assert progress == [False, True]


def test_render_aligns_fields_and_nests_mappings_and_lists():
    text = output.render({"a": 1, "long_name": 0.5, "ok": False, "none": None, "nested": {"x": [1, 2]},
                          "rows": [{"k": "v"}], "empty": []})
    assert text.splitlines() == ["a          1", "long_name  0.5", "ok         no", "none       -", "nested:",
                                 "  x  1, 2", "rows:", "  - k  v", "empty      (none)"]


# -- progress bars ------------------------------------------------------------------------------------------

class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_show_only_on_a_terminal():
    assert output.progress_bar(total=3, stream=io.StringIO()).disable
    assert not output.progress_bar(total=3, stream=_Terminal()).disable
    assert output.progress_bar(total=3, stream=_Terminal(), enabled=False).disable
    closed = io.StringIO()
    closed.close()
    assert output.progress_bar(total=3, stream=closed).disable


def test_progress_bars_go_to_stderr_and_are_off_in_a_pipe():
    proc = subprocess.run([sys.executable, "-c", "from modpipe.output import progress_bar\n"
                           "for _ in progress_bar(range(3), desc='x'): pass\nprint('done')"],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout == "done\n" and proc.stderr == ""


def test_only_modpipe_output_makes_progress_bars():
    """Every bar goes through modpipe.output.progress_bar, which turns itself off when stderr is no terminal."""
    users = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n.split(".")[0] == "tqdm" for n in names):
                    users.append(str(path.relative_to(ROOT)))
    assert users == ["modpipe/output.py"]
