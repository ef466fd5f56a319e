"""`modpipe up`'s supervision without processes: the restart backoff and which component is restarted when."""

from __future__ import annotations

from modpipe.streams.local.stack import LocalStack, Restarts


def test_backoff_doubles_per_death_in_a_row_up_to_the_cap():
    r = Restarts(base_s=1, max_s=30, healthy_after_s=60, started_at=0.0)
    delays, now = [], 1.0
    for _ in range(8):
        due = r.died(now)
        assert r.died(now + 0.5) == due  # the same death noted twice schedules once
        assert not r.due(due - 0.01) and r.due(due)
        delays.append(due - now)
        r.restarted(due)
        now = due + 1.0  # dies again a second after each restart
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert r.total == 8


def test_a_component_that_stayed_up_starts_again_from_the_shortest_delay():
    r = Restarts(base_s=1, max_s=30, healthy_after_s=60, started_at=0.0)
    for t in (10.0, 20.0, 30.0):
        r.restarted(r.died(t))
    assert r.failures == 3
    assert r.died(r.started_at + 61) - (r.started_at + 61) == 1  # up for over a minute: not "in a row"


def test_no_overflow_after_many_deaths():
    r = Restarts(base_s=1, max_s=30)
    for i in range(5000):
        r.restarted(r.died(float(i)))
    assert r.failures == 5000
    assert r.died(r.started_at + 1) == r.started_at + 31  # still the cap: 2 ** 5000 is never computed


class FakeProcess:
    def __init__(self):
        self.up = True

    def alive(self):
        return self.up


class FakeBroker:
    """What LocalStack asks of its broker for supervision: `components()`, name -> (alive?, restart)."""

    def __init__(self):
        self.process = FakeProcess()
        self.restart = lambda: None

    def components(self):
        return {"broker": (lambda: self.process.alive(), lambda: self.restart())}


def test_supervise_restarts_what_died_once_its_backoff_is_over(monkeypatch):
    from modpipe.settings import Settings

    stack = LocalStack(Settings.from_env({}))
    broker = FakeBroker()
    stack.broker = broker
    restarted = []

    def restart_broker():
        restarted.append("broker")
        broker.process = FakeProcess()

    broker.restart = restart_broker
    assert stack.supervise(now=0.0) == [] and stack.component_states() == {"broker": "up"}
    broker.process.up = False
    assert stack.supervise(now=100.0) == ["broker died; restarting in 1 s"]
    assert stack.component_states()["broker"].startswith("down (restart in")
    assert stack.supervise(now=100.5) == [] and restarted == []
    events = stack.supervise(now=101.0)
    assert restarted == ["broker"] and events == ["broker restarted (1 so far)"]
    assert stack.component_states() == {"broker": "up (1 restarts)"}


def test_a_restart_that_fails_is_tried_again_later(monkeypatch):
    from modpipe.settings import Settings

    stack = LocalStack(Settings.from_env({}))
    stack.broker = FakeBroker()
    stack.broker.process.up = False
    calls = []

    def failing():
        calls.append(1)
        raise RuntimeError("port 9092 is already in use")

    stack.broker.restart = failing
    stack.supervise(now=0.0)
    events = stack.supervise(now=1.0)
    assert calls == [1] and "did not start (port 9092 is already in use)" in events[0]
    assert stack.restarts["broker"].next_at is not None  # scheduled again, with a longer delay


def test_a_stop_signal_inside_the_status_line_or_a_restart_is_not_swallowed(monkeypatch):
    """`modpipe up` raises its stop from the SIGINT/SIGTERM handler wherever the main thread is. The status
    line's group lag and the restarts catch `Exception` (a slow broker must not crash the stack); a stop
    raised inside them must still end `up`."""
    import signal
    import types

    from modpipe import exits
    from modpipe.services import group_lag

    def slow_broker(*args, **kwargs):
        exits._raise(signal.SIGTERM, None)  # the signal arrives while the lag query waits on the broker

    monkeypatch.setattr(group_lag, "uncommitted_input", slow_broker)
    stack = LocalStack.__new__(LocalStack)
    stack.settings, stack.bootstrap = None, "127.0.0.1:1"
    stack.topics = types.SimpleNamespace(inputs=lambda: ["posts"])
    try:
        stack.group_lag()
    except exits.Terminated:
        pass
    else:
        raise AssertionError("the stop was swallowed by the status line's guard")
    # and any `except Exception` guard, e.g. supervise()'s around a restart
    try:
        try:
            exits._raise(signal.SIGTERM, None)
        except Exception:  # noqa: BLE001 - what the guards do
            raise AssertionError("the stop was swallowed by an `except Exception`") from None
    except exits.Terminated:
        pass
