"""`modpipe decision train`: a model that cannot learn to be deaf to the text (monotone in the text
probability, a text floor chosen against the review load), on a stand-in text model (no ONNX)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from modpipe.decision import dataset, train
from modpipe.decision.engine import DecisionEngine
from modpipe.decision.model import DECISION_FEATURES, DecisionModel
from modpipe.settings import Settings
from tests.unit.test_decision_eval import FakeBuild, FakeTextModel

TEXT = DECISION_FEATURES.index("text_probability")


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    monkeypatch.setattr(dataset, "TextProbabilities", FakeTextModel)
    config = train.TrainConfig(scenarios=("human_lures", "mixed", "ham_only"), rates=(50.0,), posts_per_run=800,
                               rounds=1)
    monkeypatch.setitem(train.PROFILES, "tiny", config)
    return Settings.from_env(cache_dir=tmp_path)


def _rows(settings, config):
    runs, probs = train._simulation(settings, FakeBuild(), config, 0, False)
    return runs, probs


@pytest.mark.parametrize("monotone", [True, False])
def test_the_score_never_falls_as_the_text_probability_rises(tiny, monotone):
    config = train.TrainConfig(**{**train.PROFILES["tiny"].__dict__, "monotone_text": monotone})
    runs, probs = _rows(tiny, config)
    booster, _ = train.train_rounds(tiny, runs, probs, config, 0, progress=False)
    rng = np.random.default_rng(0)
    rows = [r for _, events in runs for r in dataset.replay(events, probs, lambda f: False)]
    x = train.matrix([rows[i] for i in rng.choice(len(rows), 300, replace=False)])
    grid = np.linspace(0, 1, 21)
    preds = []
    for p in grid:
        x[:, TEXT] = p
        preds.append(booster.predict(x))
    steps = np.diff(np.asarray(preds), axis=0)  # (grid step, row)
    if monotone:
        assert (steps >= -1e-12).all()
    assert np.asarray(preds)[-1].mean() > np.asarray(preds)[0].mean()  # the text matters either way


def _row(i, spam, text_p):
    return dataset.Row(f"p{i}", "r", i, {"text_probability": text_p, "domain_banned": False, "ip_banned": False}, {
        "is_spam": spam})


class AllowAll:
    """A stand-in DecisionModel whose booster scores every post 0.01: only the floor can flag anything."""

    version = "allow-all"
    meta: dict = {}

    def contributions(self, x):
        out = np.zeros((len(x), len(DECISION_FEATURES) + 1))
        out[:, -1] = np.log(0.01 / 0.99)
        return out


def test_the_lowest_floor_within_both_budgets_is_chosen():
    # 1000 posts: 100 spam the text model rates 0.99; 900 legit: 9 at 0.75, 9 at 0.55, the rest 0.1
    rows = [_row(i, True, 0.99) for i in range(100)]
    rows += [_row(100 + i, False, 0.75 if i < 9 else 0.55 if i < 18 else 0.1) for i in range(900)]
    config = train.TrainConfig(text_floors=(0.5, 0.7, 0.9), review_budget=0.2, legit_flag_budget=0.015)
    floor, candidates = train.choose_text_floor(AllowAll(), rows, config, 0.5, 0.9)
    assert [c["floor"] for c in candidates] == [None, 0.5, 0.7, 0.9]
    by = {c["floor"]: c for c in candidates}
    assert by[None] == {"floor": None, "review_share": 0.0, "legit_flagged": 0.0, "spam_caught": 0.0}
    assert by[0.5]["legit_flagged"] == 0.02 and by[0.7]["legit_flagged"] == 0.01 and by[0.9]["legit_flagged"] == 0
    assert by[0.5]["review_share"] == 0.118 and by[0.7]["spam_caught"] == 1.0
    assert floor == 0.7  # 0.5 flags 2% of legitimate posts, over the 1.5% budget
    tight = train.TrainConfig(text_floors=(0.5, 0.7, 0.9), review_budget=0.05, legit_flag_budget=0.015)
    assert train.choose_text_floor(AllowAll(), rows, tight, 0.5, 0.9)[0] is None  # 100 spam alone are 10% reviews


def test_train_keeps_the_chosen_floor_in_the_model_and_the_engine_uses_it(tiny):
    path = train.train(tiny, FakeBuild(), profile="tiny", progress=False)
    meta = json.loads((path / "model.json").read_text())
    chosen = meta["rounds"][-1]["text_floor"]["chosen"]
    assert meta["policy"] == {"text_floor": chosen}
    assert chosen is None or chosen in train.PROFILES["tiny"].text_floors
    assert [c["floor"] for c in meta["rounds"][-1]["text_floor"]["candidates"]] == \
        [None, *train.PROFILES["tiny"].text_floors]
    assert DecisionEngine.for_model(DecisionModel.load(path), 0.5, 0.9).text_floor == chosen


def test_a_scenario_of_platform_registers_is_skipped_on_a_build_without_them():
    """`platform_lures` draws only from today's platform registers: trained on a build that has them, skipped (and
    said in the log) on one built with `--no-platforms`, where it has nothing to post."""
    old = [{"text": f"old corpus text {i}", "label": i % 2, "dataset": "sms"} for i in range(60)]
    new = [{"text": f"a platform's post {i}", "label": i % 2, "dataset": "x_posts"} for i in range(60)]
    config = train.TrainConfig(scenarios=("platform_lures", "ham_only"), rates=(50.0,), posts_per_run=100)
    assert [name.split("@")[0] for name, _ in train.simulated_runs(old, config, 0)] == ["ham_only"]
    assert [name.split("@")[0] for name, _ in train.simulated_runs(old + new, config, 0)] == ["platform_lures",
                                                                                              "ham_only"]
