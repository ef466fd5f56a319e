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


def test_text_floor_lifts_an_allowed_post_to_review_and_says_why(model):
    rng = np.random.default_rng(2)
    clean = _features(rng, False)  # everything about the account says ham ...
    clean.update(text_probability=0.97, ip_posts=1, ip_distinct_users=1)  # ... but the text model is sure
    plain = DecisionEngine(model, 0.5, 0.9)
    floored = DecisionEngine(model, 0.5, 0.9, text_floor=0.9)
    before, after = plain.decide_many([clean])[0], floored.decide_many([clean])[0]
    if before.verdict == "allow":
        assert after.verdict == "review"
        assert after.reasons[0]["feature"] == "text_probability" and "text floor (0.9)" in after.reasons[0]["description"]
        assert [r["feature"] for r in after.reasons].count("text_probability") == 1
    else:  # the model already listens: the floor changes nothing
        assert after.verdict == before.verdict and after.reasons == before.reasons
    # a consumer thresholding spam_probability reads the same verdict
    assert after.spam_probability == (max(before.spam_probability, 0.5) if after.verdict == "review" and
                                      before.verdict == "allow" else before.spam_probability)
    below = dict(clean, text_probability=0.89)
    assert floored.decide_many([below])[0].verdict == plain.decide_many([below])[0].verdict


def test_text_floor_spares_an_author_at_home_only():
    from modpipe.decision.engine import at_home

    assert at_home({"ip_posts": 5, "ip_distinct_users": 1})
    assert not at_home({"ip_posts": 1, "ip_distinct_users": 1})  # a first post from this address
    assert not at_home({"ip_posts": 40, "ip_distinct_users": 7})  # a shared address (carrier NAT, café)
    assert not at_home({"ip_posts": None, "ip_distinct_users": None})


def test_text_floor_leaves_the_models_verdict_to_an_author_at_home(model):
    rng = np.random.default_rng(2)
    home = _features(rng, False)
    home.update(text_probability=0.97, ip_posts=12, ip_distinct_users=1)
    plain, floored = DecisionEngine(model, 0.5, 0.9), DecisionEngine(model, 0.5, 0.9, text_floor=0.9)
    assert floored.decide_many([home])[0] == plain.decide_many([home])[0]


def test_text_floor_never_lowers_a_verdict(model):
    rng = np.random.default_rng(3)
    feats = [_features(rng, spam) for spam in rng.random(200) < 0.5]
    plain = DecisionEngine(model, 0.5, 0.9).decide_many(feats)
    floored = DecisionEngine(model, 0.5, 0.9, text_floor=0.5).decide_many(feats)
    rank = {"allow": 0, "review": 1, "block": 2}
    assert all(rank[b.verdict] >= rank[a.verdict] for a, b in zip(plain, floored, strict=True))
    # _features carries no address counts: no author is at home, the floor covers everyone
    assert all(v.verdict != "allow" for f, v in zip(feats, floored, strict=True) if f["text_probability"] >= 0.5)


def test_text_floor_from_the_model_or_the_setting(model):
    trained = DecisionModel(model.booster, model.features, model.version, {"policy": {"text_floor": 0.8}})
    assert DecisionEngine.for_model(trained, 0.5, 0.9).text_floor == 0.8
    assert DecisionEngine.for_model(trained, 0.5, 0.9, "off").text_floor is None
    assert DecisionEngine.for_model(trained, 0.5, 0.9, "0.95").text_floor == 0.95
    assert DecisionEngine.for_model(model, 0.5, 0.9).text_floor is None  # a model trained without one


def test_text_floor_setting_is_validated():
    from modpipe.settings import Settings, SettingsError

    assert Settings.from_env({"MODPIPE_TEXT_FLOOR": "0.7"}).text_floor == "0.7"
    for bad in ("1.5", "high", "-0.1"):
        with pytest.raises(SettingsError, match="MODPIPE_TEXT_FLOOR"):
            Settings.from_env({"MODPIPE_TEXT_FLOOR": bad})


@pytest.fixture(scope="module")
def noisy_model() -> DecisionModel:
    """Trained on labels a third of which are flipped: scores spread over (0, 1), so all three verdicts occur."""
    rng = np.random.default_rng(5)
    rows = [(_features(rng, spam), spam ^ (rng.random() < 0.33)) for spam in rng.random(2000) < 0.5]
    x = np.asarray([decision_vector(f) for f, _ in rows])
    y = np.asarray([s for _, s in rows], dtype=float)
    booster = lgb.train({"objective": "binary", "verbose": -1, "seed": 0, "deterministic": True,
                         "min_data_in_leaf": 20, "num_threads": 1},
                        lgb.Dataset(x, y, feature_name=list(DECISION_FEATURES)), num_boost_round=40)
    return DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster))


@pytest.mark.parametrize("text_floor", [None, 0.5])
def test_reasons_for_flagged_posts_only_keep_every_verdict_and_probability(noisy_model, text_floor):
    rng = np.random.default_rng(7)
    feats = [_features(rng, spam) for spam in rng.random(400) < 0.5]
    for f in feats[::5]:  # some authors at home, so that the floor's exception is taken too
        f.update(ip_distinct_users=1, ip_posts=3)
    probs = noisy_model.predict(np.asarray([decision_vector(f) for f in feats]))
    review, block = (float(q) for q in np.quantile(probs, [0.4, 0.8]) + 1e-7)  # all three verdicts
    everyone = DecisionEngine(noisy_model, review, block, text_floor=text_floor)
    flagged = DecisionEngine(noisy_model, review, block, text_floor=text_floor, reasons_for="flagged")
    before, after = everyone.decide_many(feats), flagged.decide_many(feats)
    assert [v.verdict for v in after] == [v.verdict for v in before]
    assert {v.verdict for v in before} == {"allow", "review", "block"}
    for a, b in zip(after, before, strict=True):
        assert round(a.spam_probability, 6) == round(b.spam_probability, 6)
        assert a.reasons == ([] if a.verdict == "allow" else b.reasons)
    assert any(v.verdict == "allow" and v.reasons for v in before)
    if text_floor is not None:  # the floor raised some allows to review: those are explained too
        assert any(v.reasons and v.reasons[0]["contribution"] is None for v in after)


def test_a_score_next_to_a_threshold_is_explained_so_its_verdict_is_the_contributions(model):
    rng = np.random.default_rng(3)
    feats = [_features(rng, spam) for spam in rng.random(50) < 0.5]
    probs = model.predict(np.asarray([decision_vector(f) for f in feats]))
    engine = DecisionEngine(model, float(probs[0]) + 5e-10, 0.99, reasons_for="flagged")  # p just under review
    assert engine._flagged(feats[0], float(probs[0]))
    assert not engine._flagged(feats[0], float(probs[0]) - 1e-6)


def test_the_reasons_setting_reaches_the_engine_and_is_checked():
    from modpipe.settings import Settings, SettingsError

    assert Settings.from_env({}).reasons == "flagged"  # what moderators read; `all` explains allows too
    assert Settings.from_env({"MODPIPE_REASONS": "all"}).reasons == "all"
    with pytest.raises(SettingsError):
        Settings.from_env({"MODPIPE_REASONS": "some"})
