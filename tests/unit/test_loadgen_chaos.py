"""`modpipe chaos`'s pure parts: the fault plan, decision accounting, and the final-state comparison of the
feature tables with modpipe.features.offline (including that it is blind to arrival order and not blind to a count)."""

from __future__ import annotations

import copy
import random
import threading
import time
from types import SimpleNamespace

import pytest
from modpipe.loadgen.chaos import (
    Fault,
    Injector,
    TrafficGate,
    assignments,
    canonical,
    compare_tables,
    count_decisions,
    decision_gaps,
    fault_plan,
    offline_tables,
    outage_summary,
    triton_outages,
)
from modpipe.simulation.simulator import simulate

from tests.unit.test_simulation_simulator import TEXTS


def test_fault_plan_has_each_fault_once_in_its_window_spaced_and_seeded():
    plan = fault_plan(1000.0, worker_kills=5, triton_kills=2, broker_restarts=1, workers=3, seed=7)
    assert sorted(f.kind for f in plan) == ["broker"] + ["triton"] * 2 + ["worker"] * 5
    times = [f.at_s for f in plan]
    assert times == sorted(times) and 100 <= times[0] and times[-1] <= 800
    slot = 700 / 8
    assert min(b - a for a, b in zip(times, times[1:], strict=False)) >= slot / 2 - 0.01  # never on top of each other
    assert all(0 <= f.worker < 3 for f in plan if f.kind == "worker")
    assert all(f.worker is None for f in plan if f.kind != "worker")
    assert plan == fault_plan(1000.0, worker_kills=5, triton_kills=2, broker_restarts=1, workers=3, seed=7)
    other = fault_plan(1000.0, worker_kills=5, triton_kills=2, broker_restarts=1, workers=3, seed=8)
    assert [(f.kind, f.at_s) for f in other] != [(f.kind, f.at_s) for f in plan]
    assert fault_plan(10.0, worker_kills=0, triton_kills=0, broker_restarts=0, workers=1, seed=0) == []


def test_a_join_starts_one_more_worker_each_and_kills_pick_among_the_first_workers():
    plan = fault_plan(100.0, worker_kills=6, triton_kills=0, broker_restarts=0, workers=2, seed=3, worker_joins=2)
    joins = [f for f in plan if f.kind == "join"]
    assert [f.worker for f in joins] == [2, 3]  # in time order, each one more than the workers so far
    assert all(0 <= f.worker < 2 for f in plan if f.kind == "worker")


def test_a_triton_outage_is_planned_to_end_inside_the_traffic():
    for seed in range(20):
        plan = fault_plan(450.0, worker_kills=2, triton_kills=1, broker_restarts=0, workers=2, seed=seed,
                          triton_outage_s=300.0)
        [triton] = [f for f in plan if f.kind == "triton"]
        assert 45 <= triton.at_s <= 0.8 * 450 - 300  # down from its kill to 80% of the traffic at the latest
        assert [f.at_s for f in plan] == sorted(f.at_s for f in plan)
    # without an outage the kill falls where its slot puts it (later than the outage allows for most seeds)
    late = [f.at_s for seed in range(20) for f in fault_plan(450.0, worker_kills=2, triton_kills=1, broker_restarts=0,
                                                             workers=2, seed=seed) if f.kind == "triton"]
    assert max(late) > 60


def _decision(at_wall: float, degraded: bool = False) -> dict:
    import datetime

    ts = datetime.datetime.fromtimestamp(at_wall, datetime.UTC).isoformat().replace("+00:00", "Z")
    return {"post_id": f"p{at_wall}", "decided_at": ts, "degraded": degraded}


def test_an_outage_summary_counts_what_was_decided_meanwhile_and_when_the_model_came_back():
    killed, back = 1_000_000.0, 1_000_300.0
    decisions = ([_decision(killed - 1)] + [_decision(killed + 30 + i, degraded=True) for i in range(50)]
                 + [_decision(killed + 2)]  # a post Triton answered just before it died
                 + [_decision(back + 0.5, degraded=True), _decision(back + 4.25), _decision(back + 9)])
    summary = outage_summary(killed, back, decisions)
    assert summary == {"down_s": 300.0, "decided_degraded_during": 50, "decided_with_the_model_during": 1,
                       "resumed_after_s": 4.25}
    assert outage_summary(killed, back, decisions[:52])["resumed_after_s"] is None  # never resumed
    assert outage_summary(killed, None, decisions)["down_s"] is None  # not back before the run ended


def test_outages_pair_each_triton_kill_with_the_supervisors_next_restart():
    killed, back = 2_000_000.0, 2_000_100.0
    faults = [{"at_s": 10.0, "kind": "worker", "killed": True, "wall_s": killed - 50},
              {"at_s": 60.0, "kind": "triton", "killed": True, "wall_s": killed},
              {"at_s": 61.0, "event": "worker-0 restarted (1 so far)", "wall_s": killed + 1},
              {"at_s": 160.0, "event": "triton restarted (1 so far)", "wall_s": back}]
    [o] = triton_outages(faults, [_decision(back + 2.0)])
    assert (o["at_s"], o["back_at_s"], o["down_s"], o["resumed_after_s"]) == (60.0, 160.0, 100.0, 2.0)


def test_decision_gaps_are_the_longest_stretch_without_a_decision_around_a_join_by_whether_the_partition_moved():
    joined = 1000.0
    decided = [(0, joined - 4 + 0.5 * i) for i in range(80)]  # every half second all along
    decided += [(1, joined - 4 + 0.5 * i) for i in range(8)] + [(1, joined + 3.0 + 0.5 * i) for i in range(60)]
    decided += [(2, joined - 100), (2, joined + 100)]  # nothing in the window: the whole window is its gap
    decided += [(3, joined - 1.0)]  # stopped for good before the join: from there to the window's end
    gaps = decision_gaps(decided, joined, 4, owners_before={0: "w0", 1: "w0", 2: "w1", 3: "w1"},
                         owners_after={0: "w0", 1: "w2", 2: "w1", 3: "w2"}, before_s=5, after_s=30)
    assert gaps["gap_s"] == {"0": 1.0, "1": 3.5, "2": 35.0, "3": 31.0}
    assert gaps["kept"] == {"partitions": 2, "p50_s": 1.0, "max_s": 35.0}
    assert gaps["moved"] == {"partitions": 2, "p50_s": 3.5, "max_s": 31.0}


def test_assignments_are_read_from_a_workers_log_lines():
    lines = ['{"ts":"2026-12-07T05:00:01.500Z","level":"info","msg":"partitions assigned; restoring tables"}',
             'not json: a stack dump line with "partitions assigned" in it',
             '{"ts":"2026-12-07T05:00:02.250Z","level":"info","msg":"partitions assigned",'
             '"topic_partitions":{"t.posts":[3,1],"t.reports":[1,3]}}']
    [(at, partitions)] = assignments(lines, "t.posts")
    assert partitions == [1, 3] and at % 60 == pytest.approx(2.25)


def decision(pid, rev=1, verdict="allow", degraded=False):
    return {"post_id": pid, "revision": rev, "verdict": verdict, "degraded": degraded}


def test_count_decisions_finds_lost_duplicates_and_degraded_posts_not_decided_again():
    records = [decision("a"), decision("a"), decision("b", degraded=True), decision("b", 2),
               decision("c", degraded=True), decision("x"), decision("d"), decision("d", 2, "block")]
    r = count_decisions(records, ["a", "b", "c", "d", "e"])
    assert (r["sent"], r["decided"], r["lost"], r["unexpected"]) == (5, 4, 1, 1)
    assert r["duplicate_decisions"] == 1 and r["posts_with_duplicates"] == 1
    assert r["examples"]["lost"] == ["e"] and r["examples"]["duplicates"] == ["a@1"]
    assert (r["degraded_posts"], r["degraded_redecided"], r["degraded_not_redecided"]) == (2, 1, 1)
    assert r["revisions"] == {1: 5, 2: 2}
    assert r["duplicates_with_another_verdict"] == 0
    assert count_decisions(records + [decision("a", verdict="block")], ["a"])["duplicates_with_another_verdict"] == 1


@pytest.fixture(scope="module")
def run():
    """A simulated run with every side stream, and decisions as a pipeline would publish them (a few spam,
    some decided again)."""
    events = simulate(TEXTS, 600, "mixed", seed=3)
    posts = {e.payload["post_id"]: e.payload for e in events if e.kind == "post"}
    rng = random.Random(1)
    decisions = [decision(pid, 1, "block" if rng.random() < 0.2 else "allow") for pid in posts]
    decisions += [decision(pid, 2, "block") for pid in list(posts)[::17]]
    assert {e.kind for e in events} >= {"post", "report", "engagement", "label"}
    return [(e.kind, e.payload) for e in events], decisions, posts


def test_final_tables_do_not_depend_on_when_decisions_arrive(run):
    events, decisions, posts = run
    first = offline_tables(events, decisions, posts)
    shuffled = decisions[:]
    random.Random(2).shuffle(shuffled)
    duplicated = shuffled + shuffled[:50]  # at-least-once: some decisions published twice
    report = compare_tables(first, offline_tables(events, duplicated, posts))
    assert report["equal"], report
    assert report["tables"]["post"]["keys"] == len(posts) and report["tables"]["user"]["keys"] > 10


def test_side_events_in_another_order_give_the_same_final_tables(run):
    """Side events reach other partitions than posts: across topics the streaming order is arbitrary."""
    events, decisions, posts = run
    posts_only = [e for e in events if e[0] == "post"]
    side = [e for e in events if e[0] != "post"]
    random.Random(4).shuffle(side)
    interleaved = side[: len(side) // 2] + posts_only + side[len(side) // 2:]
    report = compare_tables(offline_tables(events, decisions, posts), offline_tables(interleaved, decisions, posts))
    assert report["equal"], report["examples"]


def test_a_count_too_many_or_a_lost_event_is_reported(run):
    events, decisions, posts = run
    expected = offline_tables(events, decisions, posts)
    twice = copy.deepcopy(expected)
    user = next(iter(twice["user"]))
    twice["user"][user]["posts"]["n"] += 1  # a replayed post counted again
    report = compare_tables(twice, expected)
    assert not report["equal"] and report["tables"]["user"]["differ"] == 1
    assert report["examples"][0]["key"] == user and report["examples"][0]["fields"] == ["posts"]

    report_event = next(i for i, e in enumerate(events) if e[0] == "report")
    lost = offline_tables(events[:report_event] + events[report_event + 1:], decisions, posts)
    assert not compare_tables(lost, expected)["equal"]

    only_some = {t: dict(list(v.items())[:-1]) for t, v in expected.items()}
    report = compare_tables(only_some, expected)
    assert not report["equal"] and report["tables"]["post"]["only_offline"] == 1


def test_canonical_drops_only_what_depends_on_timing():
    post = {"info": {"user_id": "u"}, "snapshot": {"features": {"x": 1}}, "ban": "domain:x.com",
            "pending": [["label", {"b": 1}], ["report", {"a": 1}]]}
    assert canonical("post", post).keys() == {"info", "pending"} and canonical("post", post)["info"] == {"user_id": "u"}
    swapped = {**post, "pending": post["pending"][::-1]}
    assert canonical("post", post) == canonical("post", swapped)
    domain = {"posts": {"n": 2}, "recent": [["p1", "h"], ["p2", "h"]], "bans": []}
    assert canonical("domain", domain) == canonical("domain", {**domain, "recent": domain["recent"][::-1]})
    assert canonical("domain", domain) != canonical("domain", {**domain, "recent": domain["recent"][:1]})
    user = {"posts": {"n": 1}}
    assert canonical("user", user) == user


def test_the_traffic_waits_at_a_fault_the_supervisor_has_not_injected_and_resumes_at_its_rate():
    # the supervising loop is busy (a restart) past the fault's time: the traffic must not run past it
    pending = [Fault(0.10, "worker", 0), Fault(0.20, "triton")]
    gate = TrafficGate(threading.Event(), pending, hold_at_most_s=10)
    produced: list[tuple[float, float]] = []  # (offset, traffic clock when produced)
    t0 = gate.clock()

    def produce():
        for event in gate.events(SimpleNamespace(offset_s=i / 20) for i in range(8)):
            produced.append((event.offset_s, gate.clock() - t0, len(pending)))

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    time.sleep(0.6)  # the loop injects nothing for a while: the traffic stops at the first fault
    assert [off for off, _, _ in produced] == [0 / 20, 1 / 20]
    pending.pop(0)
    time.sleep(0.3)
    assert [off for off, _, _ in produced] == [0 / 20, 1 / 20, 2 / 20, 3 / 20]
    pending.pop(0)
    producer.join(5)
    assert [off for off, _, _ in produced] == [i / 20 for i in range(8)]
    # every event from a fault's point on came after that fault had left the plan
    assert all(left < 2 for off, _, left in produced if off >= 0.1)
    assert all(left == 0 for off, _, left in produced if off >= 0.2)
    # the traffic's clock leaves the held time out: the events after a hold are not owed as a burst
    assert gate.held_s >= 0.8
    assert all(clock < off + 0.2 for off, clock, _ in produced if off >= 0.2), produced


def test_a_gate_without_faults_holds_nothing():
    gate = TrafficGate(threading.Event(), [])
    assert [e.offset_s for e in gate.events(SimpleNamespace(offset_s=o) for o in (0.0, 1.0, 2.0))] == [0.0, 1.0, 2.0]
    assert gate.held_s < 0.1


def test_a_node_fault_waits_until_the_node_killed_before_is_back_in_sync():
    """A node's process runs again a second after its kill and the cluster still lists it, long before it is in
    every ISR: the next node fault waits for that too, else two of three nodes are down at once."""
    polls: list[int] = []

    class Cluster:
        nodes = [SimpleNamespace(node_id=i, alive=lambda: True) for i in (1, 2, 3)]

        def broker_ids(self):
            return {1, 2, 3}

        def under_replicated(self):
            polls.append(1)
            return max(0, 3 - len(polls))  # catching up for two looks

        def transaction_coordinator(self, transactional_id):
            assert len(polls) >= 3, "a role was looked up before the cluster had healed"
            return 2

    stack = SimpleNamespace(broker=Cluster(), supervise=lambda: [], settings=None)
    injector = Injector(stack, producer=None, paused=threading.Event())
    injector.transactional_id = lambda index: "app-worker-0-1"
    injector.HEAL_WAIT_S = 10.0
    started = time.monotonic()
    assert injector._wait_for_nodes(Fault(1.0, "txn-coordinator", 0)) == 2
    assert len(polls) == 3 and time.monotonic() - started < 5.0


def test_a_triton_kill_with_an_outage_leaves_its_restart_to_the_supervisor_after_the_outage():
    from modpipe.streams.local.stack import LocalStack

    class Proc:
        def __init__(self):
            self.up = True

        def alive(self):
            return self.up

        def kill(self):
            self.up = False

    proc, restarted = Proc(), []
    stack = SimpleNamespace(triton=SimpleNamespace(process=proc), workers=[], broker=None, restarts={},
                            components=lambda: {"triton": (proc.alive, lambda: restarted.append(time.monotonic()))})
    out = Injector(stack, producer=None, paused=threading.Event(), triton_outage_s=300.0)(Fault(5.0, "triton"), 5.0)
    assert out["killed"] and not proc.up
    supervise = LocalStack.supervise.__get__(stack)
    now = time.monotonic()
    assert supervise(now + 299.0) == [] and not restarted  # down for the outage: no restart, no second death noted
    assert supervise(now + 301.0) == ["triton restarted (1 so far)"] and len(restarted) == 1
