"""`modpipe decision eval`: scenarios, segments, and the with/without ablation of a feature group (no ONNX
text model: a stand-in scores texts, fooled by disguised ones as a text filter would be)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from modpipe.features.journey import JOURNEY_FEATURES

from modpipe.decision import dataset, evaluate, train
from modpipe.decision.model import DECISION_FEATURES
from modpipe.settings import Settings

SPAM = [f"WINNER!! You have won a {i}000 prize. Call 0906{i:04d} now to claim your reward, T&C apply"
        for i in range(30)]
HAM = [f"hey, are we still on for lunch on day {i}? I can bring the {w}" for i, w in
       enumerate(["salad", "bread", "cake", "drinks", "chips", "fruit", "cheese", "wine"] * 5)]


class FakeBuild:
    version = "fake-text-model"

    def heldout(self):
        return [{"text": t, "label": 1, "dataset": "sms"} for t in SPAM] + \
            [{"text": t, "label": 0, "dataset": "sms"} for t in HAM]


class FakeTextModel:
    """Spam texts as written score high; a disguised text (not one of the originals) slips through."""

    def __init__(self, build, cache_dir, threads=2, progress=True):
        self.spam = set(SPAM)

    def ensure(self, texts):
        list(texts)

    def __getitem__(self, text):
        return 0.95 if text in self.spam or text.rsplit(" ", 1)[0] in self.spam else 0.05


def test_eval_and_training_cover_the_obfuscated_campaign():
    assert "obfuscated_campaign" in evaluate.EVAL_SCENARIOS
    assert "obfuscated_campaign" in train.TrainConfig().scenarios
    assert set(train.TrainConfig().scenarios) == set(evaluate.EVAL_SCENARIOS)


def test_score_segments_obfuscated_posts():
    def row(i, spam, obfuscated, p):
        truth = {"is_spam": spam, "actor": "spammer" if spam else "legit", "stealth": False, "obfuscated": obfuscated}
        return dataset.Row(f"p{i}", "r", i, {"text_probability": p, "domain_banned": False, "ip_banned": False}, truth)

    rows = [row(0, True, True, 0.1), row(1, True, True, 0.95), row(2, True, False, 0.95), row(3, False, True, 0.2),
            row(4, False, False, 0.1)]
    from modpipe.decision.verdict import ThresholdDecider

    s = evaluate.score(rows, ThresholdDecider(0.5, 0.9))
    assert s["segments"]["obfuscated"] == {"posts": 2, "flagged": 1, "flagged_share": 0.5}
    assert s["segments"]["legit_obfuscated"]["flagged"] == 0 and s["segments"]["spam_text"]["posts"] == 3


def test_matrix_drops_columns_as_missing():
    rows = [dataset.Row("p", "r", 0, {"text_probability": 0.5, "journey_steps": 2, "user_friends": 3}, {})]
    full, dropped = train.matrix(rows), train.matrix(rows, JOURNEY_FEATURES)
    i = DECISION_FEATURES.index("journey_steps")
    assert full[0, i] == 2.0 and math.isnan(dropped[0, i])
    assert dropped[0, DECISION_FEATURES.index("user_friends")] == 3.0
    assert train.matrix([]).shape[0] == 0
    with pytest.raises(ValueError, match="bogus"):
        train.matrix(rows, ["bogus"])


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    monkeypatch.setattr(dataset, "TextProbabilities", FakeTextModel)
    config = train.TrainConfig(scenarios=("obfuscated_campaign", "mixed", "ham_only"), rates=(50.0,),
                               posts_per_run=600, rounds=1)
    monkeypatch.setitem(train.PROFILES, "tiny", config)
    return Settings.from_env(cache_dir=tmp_path)


def test_ablation_trains_with_and_without_the_features_side_by_side(tiny):
    report = evaluate.ablation(tiny, FakeBuild(), JOURNEY_FEATURES, profile="tiny", n_posts=400,
                               scenarios=("obfuscated_campaign", "ham_only"), progress=False)
    assert report["ablation"] == list(JOURNEY_FEATURES) and report["text_model"] == "fake-text-model"
    assert 0 < report["dropped_gain_share"] < 1 and report["top_gain"]["engine_without"]
    assert set(report["decision_models"]) == {"engine", "engine_without"}
    for entry in list(report["scenarios"].values()) + [report["overall"]]:
        assert set(entry) == {"text_only", "engine", "engine_without"}
    ob = report["scenarios"]["obfuscated_campaign"]
    # the stand-in text model misses every disguised spam text
    assert ob["text_only"]["segments"]["obfuscated"]["flagged_share"] < 0.2
    table = evaluate.format_ablation(report)
    assert "| obfuscated_campaign |" in table and "| overall |" in table and "journey_min_step_ms" in table
    with pytest.raises(ValueError, match="text_leet_share"):  # measured, then left out of the model
        evaluate.ablation(tiny, FakeBuild(), ["text_leet_share"], profile="tiny")


def test_a_dropped_feature_is_never_split_on(tiny):
    runs, probs = train._simulation(tiny, FakeBuild(), train.PROFILES["tiny"], 0, False)
    booster, rounds = train.train_rounds(tiny, runs, probs, train.PROFILES["tiny"], 0, progress=False,
                                         drop=JOURNEY_FEATURES)
    gain = dict(zip(DECISION_FEATURES, booster.feature_importance("gain"), strict=True))
    assert all(gain[n] == 0 for n in JOURNEY_FEATURES) and sum(gain.values()) > 0
    assert len(rounds) == 1 and rounds[0]["train_rows"] > 0
    x = np.asarray([[0.5] * len(DECISION_FEATURES)])
    x2 = x.copy()
    x2[0, [DECISION_FEATURES.index(n) for n in JOURNEY_FEATURES]] = 1.0
    assert booster.predict(x) == pytest.approx(booster.predict(x2))


def _segment_row(i, spam, p, *, age, url=False, journey=(1500, False), lure=None, dataset_name="sms"):
    steps, without_typing = journey
    features = {"text_probability": p, "domain_banned": False, "ip_banned": False, "user_age": age,
                "url_present": url, "journey_steps": 3 if steps else 0, "journey_min_step_ms": steps,
                "journey_submit_without_typing": without_typing}
    truth = {"is_spam": spam, "actor": "spammer" if spam else "legit", "stealth": False, "lure": lure,
             "dataset": dataset_name}
    return dataset.Row(f"p{i}", "r", i, features, truth)


def test_account_segments_read_what_the_decider_sees():
    assert evaluate.account_segment(_segment_row(0, True, 0.9, age=0.5).features) == "new <2d | no link | human"
    assert evaluate.account_segment(_segment_row(0, True, 0.9, age=90, url=True, journey=(20, False)).features) \
        == "aged 30-400d | link | scripted"
    assert evaluate.account_segment(_segment_row(0, True, 0.9, age=5000, journey=(0, None)).features) \
        == "old >400d | no link | none"
    assert evaluate.age_band(None) == "age unknown" and evaluate.age_band(10) == "young 2-30d"
    assert evaluate.journey_kind({"journey_steps": 2, "journey_min_step_ms": 500,
                                  "journey_submit_without_typing": True}) == "scripted"


class Deaf:
    """A decider that allows every post on an account older than 30 days, whatever the text says."""
    version = "deaf"

    def decide_many(self, features_list):
        from modpipe.decision.verdict import ThresholdDecider, Verdict

        text = ThresholdDecider(0.5, 0.9).decide_many(features_list)
        return [Verdict("allow", 0.0) if f["user_age"] > 30 else v for f, v in zip(features_list, text, strict=True)]


def test_a_deaf_engine_shows_in_the_segments_and_fails_the_lure_targets():
    from modpipe.decision.verdict import ThresholdDecider

    rows = [_segment_row(i, True, 0.95, age=age, lure="aged" if age > 30 else "new",
                         dataset_name=("sms", "spamassassin")[i % 2]) for i, age in enumerate([1, 1, 90, 90, 120, 120])]
    rows += [_segment_row(10 + i, False, 0.6 if i == 0 else 0.1, age=90) for i in range(50)]
    scores = {"text_only": evaluate.score(rows, ThresholdDecider(0.5, 0.9)), "engine": evaluate.score(rows, Deaf())}
    segs = evaluate.pooled_segments([scores, scores])  # two scenarios' worth: counts add up
    assert segs["engine"]["aged 30-400d | no link | human"] == {"spam": 8, "spam_flagged": 0, "legit": 100,
                                                                "legit_flagged": 0}
    assert segs["text_only"]["aged 30-400d | no link | human"]["spam_flagged"] == 8
    assert evaluate.deaf_segments(segs) == ["aged 30-400d | no link | human"]
    targets = evaluate.lure_targets({"human_lures": scores})
    assert targets["lure_segments_engine_at_least_text"] == {"deaf_segments": ["aged 30-400d | no link | human"],
                                                             "met": False}
    assert targets["lure_sms_caught"]["engine"] == 0.3333 and not targets["lure_sms_caught"]["met"]
    assert targets["lure_sms_caught"]["text_only"] == 1.0
    legit = targets["lure_scenarios_legit_flagged"]
    assert legit["text_only"] == 0.02 and legit["engine"] == 0.0 and legit["met"]
    table = evaluate.segment_table(segs, "lures:")
    assert "| aged 30-400d | no link | human | 8 | 1.000 / 0.000 | 100 | 0.020 / 0.000 | < |" in table
    assert "| new <2d | no link | human | 4 | 1.000 / 1.000 | 0 | - / - |  |" in table


def test_registers_compare_the_engine_with_its_text_model_on_each_data_set():
    """Per register, pooled over scenarios: lures caught and legitimate posts flagged by the text model alone and by
    the engine. The deaf engine lets aged accounts' lures through: below its text model on the register whose
    lures came from aged accounts, not on the other; flagging fewer legitimate posts is never 'worse'."""
    from modpipe.decision.verdict import ThresholdDecider

    rows = [_segment_row(i, True, 0.95, age=age, lure="aged" if age > 30 else "new",
                         dataset_name="youtube" if age > 30 else "instagram") for i, age in enumerate([1, 1, 90, 90])]
    rows += [_segment_row(10 + i, False, 0.6 if i < 2 else 0.1, age=90 if i < 2 else 1,
                          dataset_name=("youtube", "instagram")[i % 2]) for i in range(20)]
    scores = {"text_only": evaluate.score(rows, ThresholdDecider(0.5, 0.9)), "engine": evaluate.score(rows, Deaf())}
    assert scores["engine"]["segments"]["legit_youtube"] == {"posts": 10, "flagged": 0, "flagged_share": 0.0}
    target = evaluate.register_targets({"human_lures": scores, "mixed": scores})
    assert target["registers"]["youtube"] == {"spam": {"posts": 4, "text_only": 1.0, "engine": 0.0},
                                              "legit": {"posts": 20, "text_only": 0.1, "engine": 0.0}}
    assert target["registers"]["instagram"]["spam"] == {"posts": 4, "text_only": 1.0, "engine": 1.0}
    assert target["engine_worse_than_text"] == ["youtube spam"] and not target["met"]  # 4 lures: beyond 2 posts
    table = evaluate.register_table(target)
    assert table.splitlines()[2].startswith("instagram") and not table.splitlines()[2].endswith("worse")
    assert table.splitlines()[3].startswith("youtube") and table.splitlines()[3].endswith("worse")
    # one seed's noise is not "worse": 1 more of 1,117 legitimate reviews flagged; 12 more is
    seg = lambda flagged: {"registers": {"reviews": {"legit": {"posts": 1117, "flagged": flagged}}}}  # noqa: E731
    assert evaluate.register_targets({"ham_only": {"text_only": seg(0), "engine": seg(1)}})["met"]
    assert evaluate.register_targets({"ham_only": {"text_only": seg(0), "engine": seg(12)}})[
        "engine_worse_than_text"] == ["reviews legit"]


def test_registers_are_counted_by_data_set_name_whatever_it_looks_like():
    """A data set whose name reads like a segment prefix ("link_...", "obfuscated") is still its own register."""
    from modpipe.decision.verdict import ThresholdDecider

    rows = [_segment_row(0, True, 0.95, age=1, lure="new", dataset_name="link_posts"),
            _segment_row(1, True, 0.95, age=1, lure="new", dataset_name="posts"),
            _segment_row(2, False, 0.6, age=90, dataset_name="obfuscated"),
            _segment_row(3, False, 0.1, age=90, dataset_name="obfuscated")]
    scores = {"text_only": evaluate.score(rows, ThresholdDecider(0.5, 0.9)), "engine": evaluate.score(rows, Deaf())}
    assert scores["text_only"]["registers"] == {"link_posts": {"spam": {"posts": 1, "flagged": 1}},
                                                "obfuscated": {"legit": {"posts": 2, "flagged": 1}},
                                                "posts": {"spam": {"posts": 1, "flagged": 1}}}
    target = evaluate.register_targets({"human_lures": scores})
    assert target["registers"]["link_posts"] == {"spam": {"posts": 1, "text_only": 1.0, "engine": 1.0}}
    assert target["registers"]["obfuscated"] == {"legit": {"posts": 2, "text_only": 0.5, "engine": 0.0}}


def test_eval_and_training_cover_the_lure_scenarios():
    assert set(evaluate.LURE_SCENARIOS) <= set(evaluate.EVAL_SCENARIOS)
    assert set(evaluate.LURE_SCENARIOS) <= set(train.TrainConfig().scenarios)


def test_eval_scores_an_earlier_model_beside_the_engine_in_one_run(tiny):
    from modpipe.decision.engine import DecisionEngine
    from modpipe.decision.model import DecisionModel

    config = train.PROFILES["tiny"]
    runs, probs = train._simulation(tiny, FakeBuild(), config, 0, False)
    booster, rounds = train.train_rounds(tiny, runs, probs, config, 0, progress=False)
    model = DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster))
    engine = DecisionEngine(model, 0.5, 0.9, text_floor=0.5)
    earlier = DecisionEngine(model, 0.5, 0.9)  # the same trees without the floor
    report = evaluate.evaluate(tiny, FakeBuild(), engine, n_posts=300, scenarios=("human_lures", "mixed"),
                               progress=False, before=earlier)
    assert report["text_floor"] == 0.5 and report["before"]["text_floor"] is None
    lures = report["scenarios"]["human_lures"]
    # with a floor at the review threshold the engine flags every lure the text model flags
    assert evaluate.deaf_segments(evaluate.pooled_segments([lures])) == []
    assert lures["engine"]["segments"]["lure_sms"]["flagged"] >= lures["text_only"]["segments"]["lure_sms"]["flagged"]
    assert set(report["before"]["targets"]) == set(report["targets"]) - {"engine_f1_overall",
                                                                         "stealth_recall_engine_vs_text_only",
                                                                         "registers_engine_vs_text_only"}
    text = evaluate.format_report(report)
    assert "before F1" in text and "caught: text / before / engine" in text and "targets of the earlier model" in text


def test_eval_over_several_seeds_reports_each_seed_and_the_mean(tiny):
    """`decision eval --seeds N`: the single-seed reports, and each decider's F1 per scenario over the seeds."""
    from modpipe.decision.engine import DecisionEngine
    from modpipe.decision.model import DecisionModel

    config = train.PROFILES["tiny"]
    runs, probs = train._simulation(tiny, FakeBuild(), config, 0, False)
    booster, _ = train.train_rounds(tiny, runs, probs, config, 0, progress=False)
    engine = DecisionEngine(DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster)), 0.5, 0.9)
    kwargs = {"n_posts": 300, "scenarios": ("human_lures", "mixed"), "progress": False}
    report = evaluate.evaluate_seeds(tiny, FakeBuild(), engine, seeds=(0, 1), **kwargs)
    assert report["seeds"] == [0, 1] and len(report["reports"]) == 2
    for seed in (0, 1):  # each seed's column is that seed's own report
        alone = evaluate.evaluate(tiny, FakeBuild(), engine, seed=seed, **kwargs)
        assert report["f1"]["mixed"]["engine"]["per_seed"][seed] == alone["scenarios"]["mixed"]["engine"]["flagged"]["f1"]
        assert report["f1"]["overall"]["text_only"]["per_seed"][seed] == alone["overall"]["text_only"]["flagged"]["f1"]
    engine_f1 = report["f1"]["overall"]["engine"]
    assert engine_f1["min"] <= engine_f1["mean"] <= engine_f1["max"]
    assert engine_f1["mean"] == round(sum(engine_f1["per_seed"]) / 2, 4)
    assert report["reports"][0]["scenarios"] != report["reports"][1]["scenarios"]  # two seeds, two samples
    text = evaluate.format_seeds(report)
    assert "evaluation seeds 0 / 1" in text and "| overall |" in text and "engine mean" in text


def test_traffic_of_named_data_sets_is_the_same_for_a_build_that_tests_on_one_more():
    """`decision eval --datasets`: a text build that adds a data set (and its test texts) replays the same posts
    as the build without it when both are named the data sets they share."""

    class WithHeadlines(FakeBuild):
        version = "fake-text-model-with-headlines"

        def heldout(self):
            return [{"text": f"headline number {i}", "label": 0, "dataset": "headlines"} for i in range(150)] + \
                super().heldout()

    plain, more = FakeBuild(), WithHeadlines()
    assert evaluate.eval_texts(plain) != evaluate.eval_texts(more)  # all their texts: other traffic
    assert evaluate.eval_texts(plain, ["sms"]) == evaluate.eval_texts(more, ["sms"]) == evaluate.eval_texts(plain)
    assert {r["dataset"] for r in evaluate.eval_texts(more, ["headlines"])} == {"headlines"}
    for bad in (["headlines"], []):
        with pytest.raises(ValueError, match="no held-out texts"):
            evaluate.eval_texts(plain, bad)
    a = dataset.simulate(evaluate.eval_texts(plain, ["sms"]), "human_lures", 7, 200, 50.0)
    b = dataset.simulate(evaluate.eval_texts(more, ["sms"]), "human_lures", 7, 200, 50.0)
    assert dataset.post_texts(a) == dataset.post_texts(b)


def test_heldout_halves_do_not_depend_on_the_build_order():
    """Two text builds holding the same held-out texts in another order give the same traffic."""
    rows = [{"text": f"held-out text {i}", "label": i % 2} for i in range(200)]
    for half in ("train", "eval"):
        forward, backward = dataset.heldout_half(rows, half), dataset.heldout_half(rows[::-1], half)
        assert forward == backward and 60 < len(forward) < 140
    assert not {r["text"] for r in dataset.heldout_half(rows, "train")} & {r["text"] for r in
                                                                           dataset.heldout_half(rows, "eval")}


def test_evaluation_only_registers_never_reach_the_training_half():
    """Phishing e-mail and airline tweets may be evaluated, not trained on (their licences are non-commercial):
    the decision model's training traffic holds none of them, its evaluation traffic does."""
    from modpipe.textmodel.platforms import EVAL_ONLY

    assert EVAL_ONLY == {"phishing_pot", "airline"}
    rows = [{"text": f"held-out text {i}", "label": i % 2, "dataset": ds}
            for i in range(300) for ds in ("sms", "phishing_pot", "airline")]
    train, held = dataset.heldout_half(rows, "train"), dataset.heldout_half(rows, "eval")
    assert {r["dataset"] for r in train} == {"sms"} and len(train) > 100
    assert {r["dataset"] for r in held} == {"sms", "phishing_pot", "airline"}


def test_ablation_refuses_the_options_it_would_ignore(capsys):
    """`decision eval --ablation` trains its own models on one seed: --seeds, --datasets and --before would be
    silently ignored, so they are refused (exit 2) before any model is loaded."""
    from modpipe.cli import build_parser

    for extra in (["--seeds", "3"], ["--datasets", "sms"], ["--before", "/nonexistent"]):
        args = build_parser().parse_args(["decision", "eval", "--ablation", "has_link", *extra])
        assert args.func(args) == 2
        assert "--ablation" in capsys.readouterr().err


def test_business_posts_and_link_lures_are_segments_of_their_own():
    from modpipe.decision.verdict import ThresholdDecider

    def row(i, p, **truth):
        return dataset.Row(f"p{i}", "r", i, {"text_probability": p, "domain_banned": False, "ip_banned": False,
                                             "user_age": 900, "url_present": True},
                           {"is_spam": truth.get("lure") is not None, "actor": "spammer" if truth.get("lure") else "legit",
                            "stealth": False, "dataset": "sms", **truth})

    rows = [row(0, 0.9, lure="aged", lure_link=True), row(1, 0.1, lure="new", lure_link=True),
            row(2, 0.9, lure="new", lure_link=False), row(3, 0.7, business=True), row(4, 0.1, business=True),
            row(5, 0.1, business=False)]
    segs = evaluate.score(rows, ThresholdDecider(0.5, 0.9))["segments"]
    assert segs["lure_link_sms"] == {"posts": 2, "flagged": 1, "flagged_share": 0.5}
    assert segs["lure_sms"]["posts"] == 1 and segs["business"] == {"posts": 2, "flagged": 1, "flagged_share": 0.5}
    assert segs["legit"]["posts"] == 3
    targets = evaluate.lure_targets({"business_commerce": {"text_only": evaluate.score(rows, ThresholdDecider(0.5, 0.9)),
                                                           "engine": evaluate.score(rows, ThresholdDecider(0.8, 0.9))}})
    assert targets["lure_link_sms_caught"]["engine"] == 0.5 and not targets["lure_link_sms_caught"]["met"]
    assert targets["business_posts_flagged"] == {"target": evaluate.BUSINESS_FLAG_TARGET, "posts": 2,
                                                 "text_only": 0.5, "engine": 0.0, "met": True}
    assert "campaign_scenarios_engine_f1" not in targets  # link lures and businesses are not campaigns


def test_every_segment_is_held_to_the_earlier_model():
    """`decision eval --before`: a segment where the new engine catches fewer spam posts, or flags more
    legitimate ones, than the earlier model on the same posts (beyond one seed's noise) is listed as worse."""
    from modpipe.decision.verdict import ThresholdDecider

    lures = [_segment_row(i, True, 0.7, age=90, url=True, lure="aged") for i in range(20)]
    legit = [_segment_row(100 + i, False, 0.7 if i < 5 else 0.1, age=2000) for i in range(200)]
    rows = lures + legit
    strict, loose = ThresholdDecider(0.8, 0.9), ThresholdDecider(0.5, 0.9)
    scored = {"text_only": evaluate.score(rows, loose), "engine": evaluate.score(rows, strict),
              "before": evaluate.score(rows, loose)}
    comparison = evaluate.segments_vs_before({"link_lures": scored})
    assert comparison["worse"] == ["account: aged 30-400d | link | human", "truth: lure_sms", "truth: spam_text"]
    seg = comparison["segments"]["account: aged 30-400d | link | human"]
    assert (seg["spam"], seg["spam_flagged"], seg["before_spam_flagged"]) == (20, 0, 20)
    assert comparison["segments"]["truth: legit"] == {"spam": 0, "spam_flagged": 0, "before_spam_flagged": 0,
                                                      "legit": 200, "legit_flagged": 0, "before_legit_flagged": 5}
    # the other way round: flagging 5 more legitimate posts of 200 is beyond the slack, losing none is not
    reverse = evaluate.segments_vs_before({"link_lures": {**scored, "engine": scored["before"],
                                                          "before": scored["engine"]}})
    assert "account: old >400d | no link | human" in reverse["worse"] and "truth: lure_sms" not in reverse["worse"]
    assert evaluate.segments_vs_before({"x": {**scored, "engine": scored["before"]}})["met"]
    table = evaluate.before_table(comparison, "lgbm-old")
    assert "| truth: lure_sms | 20 | 1.000 -> 0.000 | 0 | - -> - | worse |" in table and "3 worse" in table


def test_several_seeds_hold_every_segment_to_the_earlier_model_over_all_their_posts(tiny):
    from modpipe.decision.engine import DecisionEngine
    from modpipe.decision.model import DecisionModel

    config = train.PROFILES["tiny"]
    runs, probs = train._simulation(tiny, FakeBuild(), config, 0, False)
    booster, _ = train.train_rounds(tiny, runs, probs, config, 0, progress=False)
    model = DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster))
    engine, earlier = DecisionEngine(model, 0.5, 0.9, text_floor=0.5), DecisionEngine(model, 0.5, 0.9)
    report = evaluate.evaluate_seeds(tiny, FakeBuild(), engine, seeds=(0, 1), before=earlier, n_posts=300,
                                     scenarios=("link_lures", "business_commerce"), progress=False)
    comparison = report["before"]["segments_vs_before"]
    one_seed = report["reports"][0]["before"]["segments_vs_before"]["segments"]
    assert comparison["segments"]["truth: business"]["legit"] > one_seed["truth: business"]["legit"] > 0
    # the same trees with a text floor at the review threshold lose no spam the trees alone caught
    assert not any(v["spam_flagged"] < v["before_spam_flagged"] for v in comparison["segments"].values())
    assert "every segment against the earlier model" in evaluate.format_seeds(report)
