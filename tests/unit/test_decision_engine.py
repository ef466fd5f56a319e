"""The decision engine without Kafka or Triton: cascade, LightGBM probabilities, reasons, model files."""

from __future__ import annotations

import json

import lightgbm as lgb
import numpy as np
import pytest

from modpipe.decision.engine import DecisionEngine, cascade, shortcut
from modpipe.decision.model import (
    DECISION_FEATURES,
    DecisionModel,
    DecisionModelMissing,
    FeatureListMismatch,
    decision_vector,
)
from modpipe.decision.reasons import describe, has_description
from modpipe.decision.verdict import ThresholdDecider


def _features(rng: np.random.Generator, spam: bool) -> dict:
    f = dict.fromkeys(DECISION_FEATURES)
    f.update(text_probability=float(rng.uniform(0.6, 1) if spam else rng.uniform(0, 0.4)),
             user_age=float(rng.uniform(0, 2) if spam else rng.uniform(30, 3000)),
             user_friends=int(rng.integers(0, 3) if spam else rng.integers(5, 500)),
             url_present=bool(rng.random() < 0.9 if spam else rng.random() < 0.3),
             domain_banned=False, ip_banned=False)
    return f


@pytest.fixture(scope="module")
def model() -> DecisionModel:
    rng = np.random.default_rng(0)
    rows = [(_features(rng, spam), spam) for spam in rng.random(600) < 0.3]
    x = np.asarray([decision_vector(f) for f, _ in rows])
    y = np.asarray([s for _, s in rows], dtype=float)
    booster = lgb.train({"objective": "binary", "verbose": -1, "seed": 0, "deterministic": True,
                         "min_data_in_leaf": 5, "num_threads": 1},
                        lgb.Dataset(x, y, feature_name=list(DECISION_FEATURES)), num_boost_round=30)
    return DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster))


class Recording:
    """A decider that records what it was asked (to prove the cascade skips banned posts)."""
    version = "recording"

    def __init__(self):
        self.seen: list[dict] = []

    def decide_many(self, features_list):
        self.seen.extend(features_list)
        return ThresholdDecider().decide_many(features_list)


def test_every_feature_has_words():
    assert [f for f in DECISION_FEATURES if not has_description(f)] == []
    assert describe("user_age", 0.5) == "the account is 0.50 days old"
    assert describe("url_shortener", True) == "the link goes through a URL shortener"
    assert describe("user_friends", None).endswith("unknown")


def test_banned_domain_or_ip_short_circuits_without_the_decider():
    rec = Recording()
    feats = [{"domain_banned": True, "text_probability": None}, {"ip_banned": True, "domain_banned": None},
             {"domain_banned": False, "ip_banned": False, "text_probability": 0.1}]
    verdicts = cascade(rec, feats)
    assert [v.short_circuit for v in verdicts] == ["domain_banned", "ip_banned", None]
    assert [v.verdict for v in verdicts[:2]] == ["block", "block"]
    assert rec.seen == [feats[2]]  # only the post no ban decided reached the decider
    assert verdicts[0].reasons[0]["description"] == "the link's domain is banned"
    assert shortcut({"domain_banned": None, "ip_banned": None}) is None


def test_engine_probability_is_the_models_and_reasons_are_sorted(model):
    engine = DecisionEngine(model, 0.5, 0.9, top_reasons=4)
    rng = np.random.default_rng(1)
    feats = [_features(rng, spam) for spam in (True, False, True, False)]
    verdicts = engine.decide_many(feats)
    expected = model.predict(np.asarray([decision_vector(f) for f in feats]))
    assert [v.spam_probability for v in verdicts] == pytest.approx(expected, abs=1e-9)
    assert verdicts[0].verdict == "block" and verdicts[1].verdict == "allow"
    for v, f in zip(verdicts, feats, strict=True):
        assert 1 <= len(v.reasons) <= 4
        sizes = [abs(r["contribution"]) for r in v.reasons]
        assert sizes == sorted(sizes, reverse=True)
        for r in v.reasons:
            assert r["value"] == f[r["feature"]]
            assert r["direction"] == ("spam" if r["contribution"] > 0 else "ham")
            assert r["description"] and r["feature"] in DECISION_FEATURES
    # the spam post's strongest reason pushes towards spam, the ham post's towards ham
    assert verdicts[0].reasons[0]["direction"] == "spam" and verdicts[1].reasons[0]["direction"] == "ham"


def test_save_load_roundtrip(model, tmp_path):
    model.save(tmp_path / "m")
    loaded = DecisionModel.load(tmp_path / "m")
    x = np.asarray([decision_vector(_features(np.random.default_rng(2), True))])
    assert loaded.version == model.version
    assert loaded.predict(x) == pytest.approx(model.predict(x))


def test_a_model_with_another_feature_list_is_refused(model, tmp_path):
    path = model.save(tmp_path / "m")
    meta = json.loads((path / "model.json").read_text())
    meta["features"] = meta["features"][:-1] + ["follower_velocity"]
    (path / "model.json").write_text(json.dumps(meta))
    with pytest.raises(FeatureListMismatch, match=rf"missing \['{DECISION_FEATURES[-1]}'\].*"
                                                  r"unknown \['follower_velocity'\].*modpipe decision train"):
        DecisionModel.load(path)
    meta["features"] = list(DECISION_FEATURES[1:2]) + [DECISION_FEATURES[0]] + list(DECISION_FEATURES[2:])
    (path / "model.json").write_text(json.dumps(meta))
    with pytest.raises(FeatureListMismatch, match="another order"):
        DecisionModel.load(path)


def test_missing_model_says_how_to_build_one(tmp_path):
    with pytest.raises(DecisionModelMissing, match="modpipe decision train"):
        DecisionModel.load(tmp_path / "nothing")


def test_decision_cache_key_follows_the_code_that_shapes_the_model():
    from pathlib import Path

    from modpipe.decision import train as T

    root = Path(T.__file__).resolve().parents[2]
    hashed = {str(p.relative_to(root)) for pattern in T.SOURCES for p in root.glob(pattern)}
    # the model's own code, the feature logic it replays and the simulation it learns from ...
    assert {"modpipe/decision/train.py", "features/state.py", "features/vector.py", "simulation/simulator.py",
            "features/obfuscation.py", "modpipe/textmodel/attacks.py"} <= hashed  # the obfuscated campaign's texts
    # ... but not the load generator's measuring and benchmarking code, which never runs in training
    assert not hashed & {"loadgen/bench/runs.py", "loadgen/measure.py", "loadgen/cli.py"}
    assert T.source_hash() == T.source_hash()
