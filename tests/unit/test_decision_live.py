"""A promoted decision model is picked up without a restart; a bad one is refused; a shadow never decides."""

from __future__ import annotations

import os

import pytest

from modpipe.decision.live import ShadowScorer, WatchedDecider, pointer_fingerprint
from modpipe.decision.verdict import Verdict


class FixedDecider:
    def __init__(self, version, verdict="allow", p=0.1):
        self.version, self.verdict, self.p = version, verdict, p

    def decide_many(self, features_list):
        return [Verdict(self.verdict, self.p) for _ in features_list]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def model_dir(root, name):
    path = root / name
    path.mkdir()
    (path / "model.json").write_text("{}")
    return path


def point(link, target):
    tmp = link.parent / ".tmp-link"
    tmp.symlink_to(target.name)
    tmp.replace(link)  # atomic, as `decision promote` does


@pytest.fixture
def models(tmp_path):
    a, b, bad = model_dir(tmp_path, "a"), model_dir(tmp_path, "b"), model_dir(tmp_path, "bad")
    link = tmp_path / "current"
    point(link, a)
    loaded = []

    def load(path):
        name = os.path.basename(os.path.realpath(path))
        loaded.append(name)
        if name == "bad":
            raise ValueError("trained on another feature list")
        return FixedDecider(name, "allow" if name == "a" else "block")

    return link, a, b, bad, load, loaded


def test_a_promotion_is_served_after_the_next_check_without_a_restart(models):
    link, a, b, _, load, loaded = models
    clock = Clock()
    decider = WatchedDecider(load, lambda: link, check_every_s=5, clock=clock)
    assert decider.version == "a" and decider.decide_many([{}])[0].verdict == "allow"
    point(link, b)
    clock.t = 4.0
    assert decider.decide_many([{}])[0].verdict == "allow"  # not looked at yet
    clock.t = 5.5
    assert decider.decide_many([{}])[0].verdict == "block" and decider.version == "b"
    clock.t = 11.0
    assert not decider.maybe_reload() and loaded == ["a", "b"]  # unchanged pointer: nothing loaded again


def test_a_model_rewritten_in_place_is_reloaded_and_a_bad_one_refused(models):
    link, a, _, bad, load, loaded = models
    clock = Clock()
    decider = WatchedDecider(load, lambda: link, check_every_s=1, clock=clock)
    point(link, bad)
    clock.t = 2
    assert not decider.maybe_reload() and decider.version == "a"  # refused: the serving model stays
    clock.t = 4
    assert not decider.maybe_reload() and loaded == ["a", "bad"]  # and not retried until it changes
    point(link, a)
    os.utime(a / "model.json", ns=(1, 1))  # a retrained model written over the served directory
    clock.t = 6
    assert decider.maybe_reload() and loaded == ["a", "bad", "a"]
    assert pointer_fingerprint(link.parent / "nowhere") is None


def test_watch_zero_never_reloads(models):
    link, _, b, _, load, loaded = models
    clock = Clock()
    decider = WatchedDecider(load, lambda: link, check_every_s=0, clock=clock)
    point(link, b)
    clock.t = 1e6
    assert decider.decide_many([{}])[0].verdict == "allow" and loaded == ["a"]


def test_the_shadow_counts_disagreements_and_never_changes_or_breaks_the_verdict():
    served = [Verdict("allow", 0.1), Verdict("review", 0.6), Verdict("block", 0.95)]
    shadow = ShadowScorer(FixedDecider("cand", "block", 0.99))
    assert shadow.observe([{}, {}, {}], served, ["p1", "p2", "p3"]) == 2
    assert [v.verdict for v in served] == ["allow", "review", "block"]

    class Broken:
        version = "broken"

        def decide_many(self, features_list):
            raise RuntimeError("boom")

    assert ShadowScorer(Broken()).observe([{}], served[:1], ["p1"]) == 0
    # bans decide before any model, in the shadow as in serving: no disagreement on them
    assert shadow.observe([{"domain_banned": True}], [Verdict("block", 1.0)], ["p4"]) == 0
