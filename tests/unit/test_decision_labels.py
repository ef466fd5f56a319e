"""Learning from moderators' labels (modpipe/decision/labels.py): the join with the decisions they judge,
and a candidate that learns what the labels say against the simulation, judged on the newest labels."""

from __future__ import annotations

import random

import pytest

from modpipe.decision import dataset
from modpipe.decision.engine import DecisionEngine
from modpipe.decision.labels import LABEL_RUN, NotEnoughLabels, fit_with_labels, label_rows
from modpipe.decision.model import DECISION_FEATURES, DecisionModel
from modpipe.decision.train import TrainConfig, fit


def test_a_label_joins_the_newest_decision_made_before_it_and_the_newest_label_wins():
    decisions = [
        {"post_id": "p1", "revision": 1, "decided_at": "2026-11-23T10:00:00.000Z", "features": {"x": 1}},
        {"post_id": "p1", "revision": 2, "decided_at": "2026-11-23T10:05:00.000Z", "features": {"x": 2}},
        {"post_id": "p1", "revision": 3, "decided_at": "2026-11-23T11:00:00.000Z", "features": {"x": 3}},
        {"post_id": "p2", "revision": 1, "decided_at": "2026-11-23T10:00:00.000Z", "features": {"x": 9}},
    ]
    labels = [
        {"post_id": "p1", "label": "ham", "moderator_id": "a", "created_at": "2026-11-23T10:06:00.000Z"},
        {"post_id": "p1", "label": "spam", "moderator_id": "b", "created_at": "2026-11-23T10:10:00.000Z"},
        {"post_id": "p3", "label": "spam", "moderator_id": "b", "created_at": "2026-11-23T10:10:00.000Z"},  # no decision
        {"post_id": "p2", "label": "ham", "moderator_id": "a", "created_at": "2026-11-23T09:00:00.000Z"},
    ]
    rows = label_rows(decisions, labels)
    assert [(r.post_id, r.spam, r.features) for r in rows] == [("p2", False, {"x": 9}), ("p1", True, {"x": 2})]
    assert all(r.run == LABEL_RUN for r in rows) and rows[1].truth["moderator_id"] == "b"


def features(rng, text_p, friends):
    return {"text_probability": text_p, "user_friends": friends, "user_posts": rng.randint(1, 50)}


def sim_rows(n=3000, seed=1):
    """The simulation's world: spam iff the text model says so."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        p = rng.random()
        rows.append(dataset.Row(f"s{i}", f"run{i % 3}", i, features(rng, p, rng.randint(0, 500)), {"is_spam": p > 0.5}))
    return rows


def contradicting_labels(n=400, seed=2):
    """Moderators say: an account with 9,999 friends and a harmless-looking text is spam (a campaign the
    simulation never had); the rest of what they label agrees with the simulation."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        if i % 2:
            f, spam = features(rng, rng.uniform(0.05, 0.3), 9_999), True
        else:
            p = rng.random()
            f, spam = features(rng, p, rng.randint(0, 500)), p > 0.5
        rows.append(dataset.Row(f"l{i}", LABEL_RUN, 10_000 + i, f, {"is_spam": spam}))
    return rows


@pytest.fixture(scope="module")
def serving():
    sim = sim_rows()
    train, valid = sim[:2400], sim[2400:]
    booster, _ = fit(train, valid, TrainConfig(), 0)
    model = DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster))
    return DecisionEngine(model, 0.5, 0.9)


def test_labels_that_contradict_the_simulation_change_the_decisions_on_the_posts_they_describe(serving):
    labels = contradicting_labels()
    candidate, report = fit_with_labels(sim_rows(), labels, serving, label_weight=10.0, eval_fraction=0.25,
                                        config=TrainConfig(), seed=0, review_threshold=0.5, block_threshold=0.9)
    engine = DecisionEngine(candidate, 0.5, 0.9)
    campaign = [r.features for r in labels[-100:] if r.truth["is_spam"] and r.features["user_friends"] == 9_999]
    assert len(campaign) == 50
    assert all(v.verdict == "allow" for v in serving.decide_many(campaign))  # what the simulation taught
    assert sum(v.verdict != "allow" for v in engine.decide_many(campaign)) >= 45  # what the labels taught
    ordinary = [{"text_probability": 0.1, "user_friends": 20, "user_posts": 3}]
    assert engine.decide_many(ordinary)[0].verdict == "allow"  # and ordinary ham stays ham
    assert report["not_worse"] and report["f1_change"] > 0.2
    assert report["held_out_labels"] == 100 and report["train_labels"] == 300
    assert report["candidate"]["f1"] > report["serving"]["f1"]


def test_a_candidate_that_is_worse_on_the_newest_labels_is_not_worse_only_if_it_says_so(serving):
    # Labels that agree with the simulation but are weighed on a contradiction only in their oldest part:
    # the held-out (newest) labels agree with the simulation, so the candidate cannot beat the serving model.
    labels = contradicting_labels()
    old = [dataset.Row(r.post_id, r.run, r.at_ms, r.features, {"is_spam": not r.spam}) for r in labels[:300]]
    rng = random.Random(3)
    new = []
    for i in range(100):
        p = rng.random()
        new.append(dataset.Row(f"n{i}", LABEL_RUN, 20_000 + i, features(rng, p, rng.randint(0, 500)), {"is_spam": p > 0.5}))
    _, report = fit_with_labels(sim_rows(), old + new, serving, label_weight=10.0, eval_fraction=0.25,
                                config=TrainConfig(), seed=0, review_threshold=0.5, block_threshold=0.9)
    assert not report["not_worse"] and report["f1_change"] < 0


def test_too_few_labels_are_refused(serving):
    with pytest.raises(NotEnoughLabels):
        fit_with_labels(sim_rows(300), contradicting_labels(10), serving, label_weight=10.0, eval_fraction=0.25,
                        config=TrainConfig(), seed=0, review_threshold=0.5, block_threshold=0.9)


def test_labelled_texts_keep_the_newest_label_of_posts_whose_text_is_known():
    from modpipe.decision.labels import labelled_texts

    posts = [{"post_id": "p1", "text": "win cash"}, {"post_id": "p2", "text": "lunch?"}, {"post_id": "p9", "text": "x"}]
    labels = [
        {"post_id": "p1", "label": "ham", "moderator_id": "a", "created_at": "2026-11-23T10:00:00.000Z"},
        {"post_id": "p1", "label": "spam", "moderator_id": "b", "created_at": "2026-11-23T10:01:00.000Z"},
        {"post_id": "p2", "label": "ham", "moderator_id": "a", "created_at": "2026-11-23T09:00:00.000Z"},
        {"post_id": "p3", "label": "spam", "moderator_id": "a", "created_at": "2026-11-23T09:30:00.000Z"},  # no text
    ]
    assert labelled_texts(posts, labels) == [
        {"text": "lunch?", "label": "ham", "post_id": "p2", "moderator_id": "a", "labelled_at": "2026-11-23T09:00:00.000Z"},
        {"text": "win cash", "label": "spam", "post_id": "p1", "moderator_id": "b",
         "labelled_at": "2026-11-23T10:01:00.000Z"}]
