"""Rate control arithmetic and the produce loop (with a fake producer and a fake clock: no wall-clock timing)."""

from __future__ import annotations

import statistics

import orjson
import pytest
from modpipe.loadgen.traffic import (
    BURST_PERIOD_S,
    arrival_times,
    planned_posts,
    produce_events,
)
from modpipe.simulation.simulator import TRUTH_HEADER, simulate

from modpipe.settings import Settings
from tests.unit.test_simulation_simulator import TEXTS


def test_constant_count_and_duration_arithmetic():
    ts = list(arrival_times("constant", 50, duration_s=2))
    assert len(ts) == 100 == planned_posts("constant", 50, 2, None)
    assert ts[0] == 0 and ts[1] == pytest.approx(0.02) and ts[-1] < 2
    assert len(list(arrival_times("constant", 50, count=30))) == 30
    assert len(list(arrival_times("constant", 50, duration_s=2, count=30))) == 30  # count first
    assert len(list(arrival_times("constant", 50, duration_s=1, count=300))) == 50  # duration first
    assert planned_posts("constant", 50, 1, 300) == 50 and planned_posts("poisson", 5, None, 7) == 7


def test_poisson_mean_rate_and_exponential_gaps():
    ts = list(arrival_times("poisson", 100, duration_s=200, seed=1))
    assert len(ts) == pytest.approx(20_000, rel=0.03)
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    assert statistics.mean(gaps) == pytest.approx(0.01, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(0.01, rel=0.05)  # exponential: sd = mean
    assert ts == sorted(ts)
    assert ts == list(arrival_times("poisson", 100, duration_s=200, seed=1))
    assert ts != list(arrival_times("poisson", 100, duration_s=200, seed=2))


def test_burst_keeps_the_mean_and_concentrates_in_windows():
    ts = list(arrival_times("burst", 40, duration_s=400, seed=3))
    assert len(ts) == pytest.approx(16_000, rel=0.03)
    in_burst = sum(1 for t in ts if t % BURST_PERIOD_S >= BURST_PERIOD_S - 2)
    assert in_burst / len(ts) == pytest.approx(0.8, abs=0.03)  # 4x for 2 s of 10 = 8 of 10 units


def test_ramp_grows_linearly():
    ts = list(arrival_times("ramp", 50, duration_s=100, seed=4))
    assert len(ts) == pytest.approx(5000, rel=0.04)
    first_half = sum(1 for t in ts if t < 50)
    assert first_half / len(ts) == pytest.approx(0.25, abs=0.03)  # Λ(D/2) = Λ(D)/4
    assert len(list(arrival_times("ramp", 50, count=200, seed=4))) == 200  # duration derived from the count


def test_bad_arguments():
    with pytest.raises(ValueError):
        list(arrival_times("constant", 0, duration_s=1))
    with pytest.raises(ValueError):
        list(arrival_times("constant", 1))
    with pytest.raises(ValueError):
        list(arrival_times("zigzag", 1, duration_s=1))


class FakeProducer:
    def __init__(self, full_every: int = 0):
        self.records, self.polls, self.full_every, self.calls = [], 0, full_every, 0

    def produce(self, topic, key, value, headers, on_delivery):
        self.calls += 1
        if self.full_every and self.calls % self.full_every == 0:
            raise BufferError("queue full")
        self.records.append((topic, key, value, headers))
        on_delivery(None, None)

    def poll(self, _t):
        self.polls += 1


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s


def test_produce_paces_on_the_schedule_keys_and_puts_truth_in_headers_only():
    events = simulate(TEXTS, 200, "mixed", seed=9, rate=100)
    settings = Settings.from_env({}, topic_prefix="x.")
    clock, producer = FakeClock(), FakeProducer(full_every=7)
    stats = produce_events(producer, settings, events, clock=clock, sleep=clock.sleep, wall=clock)
    assert len(producer.records) == len(events) == stats.events
    assert stats.posts == 200 and stats.by_kind["post"] == 200
    assert clock.now == pytest.approx(max(e.offset_s for e in events), abs=0.06)
    topics = {r[0] for r in producer.records}
    assert "x.posts" in topics and topics <= {f"x.{t}" for t in ("posts", "reports", "engagements", "labels", "bans")}
    for (topic, key, value, headers), e in zip(producer.records, events, strict=True):
        assert topic == f"x.{e.topic}" and key == e.key.encode()
        assert orjson.loads(value) == e.payload and b"is_spam" not in value
        assert dict(headers)[TRUTH_HEADER] == orjson.dumps(e.truth)
    # produce timestamps follow the schedule
    for e in events:
        if e.kind == "post":
            assert stats.sent_at[e.payload["post_id"]] == pytest.approx(e.offset_s, abs=0.06)
            assert stats.truth[e.payload["post_id"]] == e.truth


class SlowProducer(FakeProducer):
    """Each produce() takes `cost_s` of the fake clock: the producer's own pace, not the schedule's."""

    def __init__(self, clock: FakeClock, cost_s: float):
        super().__init__()
        self.clock, self.cost_s = clock, cost_s

    def produce(self, topic, key, value, headers, on_delivery):
        self.clock.now += self.cost_s
        super().produce(topic, key, value, headers, on_delivery)


def _posts_at(rate: float, n: int):
    posts = [e for e in simulate(TEXTS, n, "mixed", seed=5, rate=rate) if e.kind == "post"]
    return [e._replace(offset_s=i / rate) for i, e in enumerate(posts)]


@pytest.mark.parametrize("cost_s", [0.004, 0.025])  # under and over the 10 ms between posts
def test_latency_from_the_schedule_shows_the_queue_a_slow_producer_hides(cost_s):
    from modpipe.loadgen.measure import Decided, summarize

    rate, n, pipeline_s = 100.0, 100, 0.05
    events = _posts_at(rate, n)
    clock = FakeClock()
    stats = produce_events(SlowProducer(clock, cost_s), Settings.from_env({}), events, clock=clock,
                           sleep=clock.sleep, wall=clock)
    pids = [e.payload["post_id"] for e in events]
    for e, pid in zip(events, pids, strict=True):
        assert stats.scheduled_at[pid] == pytest.approx(e.offset_s)  # wall starts at 0 here
        assert stats.scheduled_at[pid] <= stats.sent_at[pid]
    # a pipeline that decides every post `pipeline_s` after its produce, whatever the load
    decided = {pid: Decided(stats.sent_at[pid] + pipeline_s, "allow", 0.1, None) for pid in pids}
    r = summarize(sent_at=stats.sent_at, scheduled_at=stats.scheduled_at, truth=stats.truth, decided=decided,
                  produce_started=stats.started, produce_finished=stats.finished, behind_s_max=stats.behind_s_max)
    produced, scheduled = r["latency_from_produce_ms"], r["latency_ms"]
    assert produced["p50_ms"] == produced["max_ms"] == pytest.approx(1000 * pipeline_s)  # flat either way
    waits = [1000 * (decided[pid].received - stats.scheduled_at[pid]) for pid in pids]
    if cost_s < 1 / rate:  # the producer keeps up: both measures agree
        assert scheduled == produced and stats.behind_s_max == 0
    else:  # it falls behind by (cost - interval) more each post: the wait grows with the queue
        behind = cost_s - 1 / rate
        assert waits == sorted(waits) and waits[-1] > 10 * waits[0]
        assert scheduled["max_ms"] == pytest.approx(1000 * (pipeline_s + (n - 1) * behind))
        assert scheduled["p50_ms"] > 10 * produced["p50_ms"]
        assert r["throughput"]["producer_behind_max_s"] == pytest.approx((n - 1) * behind, abs=1e-3)
