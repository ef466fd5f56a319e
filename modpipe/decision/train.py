"""`modpipe decision train`: labelled load-generator traffic -> LightGBM decision model, cached by key.

Data: each training scenario is simulated (seeded) from the training half of the held-out texts, at a
few rates, and replayed through the feature code (`dataset.replay`). Split by time within each run: the
first `train_fraction` of its posts train, the rest validate (early stopping), so the model is judged
on traffic that comes after what it learned from, as in production.

Feedback: the tables count the pipeline's own blocks, so the features depend on the decider. Round 0
replays with the text-only decider feeding back; the model trained on it is then the feedback of
round 1, whose model is the result. Both rounds are deterministic given the seed.

Never deaf to the text: the model is monotone in `text_probability` (a higher text probability never
lowers the score, whatever else a tree split on), the simulation includes link-less lures posted by
people from ordinary-looking accounts, and the text floor (`choose_text_floor`, kept in model.json as
`policy.text_floor`) sends what the text model rates highly at least to review, chosen on the validation
side against the review load.

The build is `$MODPIPE_CACHE_DIR/decision/<key>/` (key: this package's code, the features code, the
text-model version, the config and the seed) and `decision/current` points at the newest one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Collection
from pathlib import Path

import numpy as np

from modpipe import log
from modpipe.decision import card, dataset
from modpipe.decision.engine import cascade
from modpipe.decision.model import DECISION_FEATURES, DecisionModel, decision_vector
from modpipe.decision.store import decision_root
from modpipe.decision.verdict import Decider, ThresholdDecider
from modpipe.output import progress_bar
from modpipe.settings import Settings
from modpipe.simulation.simulator import SCENARIOS, can_run
from modpipe.textmodel.artifacts import ModelBuild

_log = log.get(__name__)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    scenarios: tuple[str, ...] = ("mixed", "campaign_burst", "stealth_campaign", "hijacked_accounts", "human_spammers",
                                  "obfuscated_campaign", "human_lures", "taken_over_lures", "link_lures",
                                  "platform_lures", "business_commerce", "ham_only")
    rates: tuple[float, ...] = (20.0, 50.0, 100.0)
    posts_per_run: int = 1500
    train_fraction: float = 0.8
    rounds: int = 2
    # Small trees, few of them: every decision's reasons cost one TreeSHAP pass, which grows with trees x
    # leaves x depth^2. 600 trees of 31 leaves took 2.8 ms per post (40% of a worker's event loop with the
    # text model off); 100 trees of 7 leaves take 0.08 ms at the same held-out F1 (measured side by side).
    num_boost_round: int = 100
    early_stopping: int = 20
    monotone_text: bool = True  # the score never falls as text_probability rises (LightGBM monotone constraint)
    # Text floor candidates, lowest first; the lowest whose extra reviews keep the validation side within
    # both budgets is kept (None when even the highest does not).
    text_floors: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)
    review_budget: float = 0.03  # share of all posts in the review band
    legit_flag_budget: float = 0.01  # share of legitimate posts flagged (review or block)
    params: tuple[tuple[str, object], ...] = (
        ("objective", "binary"), ("learning_rate", 0.2), ("num_leaves", 7), ("min_data_in_leaf", 50),
        ("feature_fraction", 0.9), ("bagging_fraction", 0.9), ("bagging_freq", 1), ("lambda_l2", 1.0),
        ("deterministic", True), ("force_row_wise", True), ("num_threads", 2), ("verbose", -1),
    )

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "params": dict(self.params)}


PROFILES = {"full": TrainConfig(), "demo": TrainConfig(rates=(50.0,), posts_per_run=1200, rounds=2)}


# The code that shapes the model: this package, the feature logic and the simulation of the traffic it
# learns from (not the load generator's producing, measuring or benchmarking code, which it never runs).
SOURCES = ("modpipe/decision/*.py", "features/*.py", "simulation/simulator.py", "modpipe/textmodel/attacks.py")


def source_hash() -> str:
    root = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for pattern in SOURCES:
        for p in sorted(root.glob(pattern)):
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def cache_key(config: TrainConfig, text_model_version: str, seed: int) -> str:
    doc = json.dumps({"sources": source_hash(), "config": config.to_dict(), "text_model": text_model_version,
                      "seed": seed}, sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def feedback_of(decider: Decider, block_threshold: float):
    """The verdict the pipeline feeds back: blocked by a shortcut or by the decider's probability."""
    def feedback(features: dict) -> bool:
        return cascade(decider, [features])[0].spam_probability >= block_threshold
    return feedback


class _Fast:
    """A DecisionEngine without reasons for the replay feedback (one row at a time: no TreeSHAP needed)."""
    def __init__(self, model: DecisionModel):
        self.model, self.version = model, model.version

    def decide_many(self, features_list):
        from modpipe.decision.verdict import Verdict
        probs = self.model.predict(np.asarray([decision_vector(f) for f in features_list]))
        return [Verdict("allow", float(p)) for p in probs]


def simulated_runs(texts: list[dict], config: TrainConfig, seed: int):
    for scenario in config.scenarios:
        if not can_run(scenario, texts):
            _log.warning("scenario skipped: the text build holds none of its data sets",
                         extra={"scenario": scenario, "datasets": list(SCENARIOS[scenario].datasets)})
            continue
        for k, rate in enumerate(config.rates):
            run_seed = seed * 1000 + k
            yield f"{scenario}@{rate:g}/s#{run_seed}", dataset.simulate(texts, scenario, run_seed,
                                                                        config.posts_per_run, rate)


def time_split(rows: list[dataset.Row], fraction: float) -> tuple[list[dataset.Row], list[dataset.Row]]:
    """Per run, the first `fraction` of posts by event time train; the rest validate."""
    train, valid = [], []
    by_run: dict[str, list[dataset.Row]] = {}
    for r in rows:
        by_run.setdefault(r.run, []).append(r)
    for run_rows in by_run.values():
        run_rows.sort(key=lambda r: (r.at_ms, r.post_id))
        cut = int(len(run_rows) * fraction)
        train += run_rows[:cut]
        valid += run_rows[cut:]
    return train, valid


def matrix(rows: list[dataset.Row], drop: Collection[str] = ()) -> np.ndarray:
    """The rows' decision vectors; the `drop` columns all NaN (a tree never splits on them: the model is
    as if trained without those features, yet takes the same input as any other)."""
    x = np.asarray([decision_vector(r.features) for r in rows], dtype=np.float64).reshape(
        len(rows), len(DECISION_FEATURES))
    if drop:
        unknown = set(drop) - set(DECISION_FEATURES)
        if unknown:
            raise ValueError(f"unknown decision features: {sorted(unknown)}")
        x[:, [DECISION_FEATURES.index(name) for name in drop]] = np.nan
    return x


def fit(train: list[dataset.Row], valid: list[dataset.Row], config: TrainConfig, seed: int,
        weight=None, drop: Collection[str] = ()) -> tuple[object, dict]:
    """`weight(row)`: a training row's weight (default 1; `--labels` weighs moderators' labels up).
    `drop`: features the model must not use (see `matrix`)."""
    import lightgbm as lgb

    # The model never sees a shortcut post: the cascade decides those before it.
    train = [r for r in train if r.features.get("text_probability") is not None]
    valid = [r for r in valid if r.features.get("text_probability") is not None]
    xt, xv = matrix(train, drop), matrix(valid, drop)
    yt = np.asarray([r.spam for r in train], dtype=np.float64)
    yv = np.asarray([r.spam for r in valid], dtype=np.float64)
    params = {**dict(config.params), "seed": seed, "metric": "binary_logloss"}
    if config.monotone_text:
        params["monotone_constraints"] = [1 if name == "text_probability" else 0 for name in DECISION_FEATURES]
        params["monotone_constraints_method"] = "advanced"
    wt = None if weight is None else np.asarray([weight(r) for r in train], dtype=np.float64)
    dtrain = lgb.Dataset(xt, yt, weight=wt, feature_name=list(DECISION_FEATURES), free_raw_data=False)
    dvalid = lgb.Dataset(xv, yv, reference=dtrain)
    booster = lgb.train(params, dtrain, num_boost_round=config.num_boost_round, valid_sets=[dvalid],
                        valid_names=["valid"], callbacks=[lgb.early_stopping(config.early_stopping, verbose=False)])
    booster = lgb.Booster(model_str=booster.model_to_string(num_iteration=booster.best_iteration))
    pv = booster.predict(xv)
    report = {"train_rows": len(train), "valid_rows": len(valid), "train_spam": int(yt.sum()),
              "valid_spam": int(yv.sum()), "best_iteration": int(booster.current_iteration()),
              "valid_logloss": round(float(-np.mean(yv * np.log(np.clip(pv, 1e-9, 1)) +
                                                    (1 - yv) * np.log(np.clip(1 - pv, 1e-9, 1)))), 5)}
    return booster, report


def train(settings: Settings, build: ModelBuild, *, profile: str = "full", seed: int = 0, force: bool = False,
          progress: bool = True) -> Path:
    config = PROFILES[profile]
    root = decision_root(settings)
    key = cache_key(config, build.version, seed)
    out = root / key
    if (out / "model.json").exists() and not force:
        _log.info("decision model is cached", extra={"path": str(out)})
        _point_current(root, out, build.version)
        return out
    started = time.monotonic()
    runs, probs = _simulation(settings, build, config, seed, progress)
    booster, rounds = train_rounds(settings, runs, probs, config, seed, progress=progress)

    model = DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster), meta={
        "policy": {"text_floor": rounds[-1]["text_floor"]["chosen"]},
        "text_model_version": build.version, "profile": profile, "seed": seed, "config": config.to_dict(),
        "rounds": rounds, "train_seconds": round(time.monotonic() - started, 1), "key": key,
        "importance_gain": _importance(booster)})
    tmp = root / f".{key}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(tmp)
    (tmp / "MODEL_CARD.md").write_text(card.render(
        version=model.version, meta=model.meta, features=model.features, text_model_version=build.version,
        texts=dataset.heldout_half(build.heldout(), "train")))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    _point_current(root, out, build.version)
    _log.info("decision model trained", extra={"path": str(out), "version": model.version, **rounds[-1]})
    return out


def train_rounds(settings: Settings, runs, probs, config: TrainConfig, seed: int, *, progress: bool = True,
                 drop: Collection[str] = ()) -> tuple[object, list[dict]]:
    """The feedback rounds (module docstring) over simulated `runs`: (final booster, per-round reports).
    `drop`: features the model must not use (`modpipe decision eval --ablation` trains with and without)."""
    decider: Decider = ThresholdDecider(settings.review_threshold, settings.block_threshold)
    rounds = []
    booster = None
    for rnd in range(config.rounds):
        feedback = feedback_of(decider, settings.block_threshold)
        rows = [row for name, events in progress_bar(runs, desc=f"replay round {rnd}", unit="run", enabled=progress)
                for row in dataset.replay(events, probs, feedback, run=name)]
        train_rows, valid_rows = time_split(rows, config.train_fraction)
        booster, report = fit(train_rows, valid_rows, config, seed, drop=drop)
        rounds.append({"round": rnd, "feedback": decider.version, **report})
        model = DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster))
        decider = _Fast(model)
    floor, candidates = choose_text_floor(model, valid_rows, config, settings.review_threshold,
                                          settings.block_threshold)
    rounds[-1]["text_floor"] = {"chosen": floor, "candidates": candidates}
    return booster, rounds


def choose_text_floor(model: DecisionModel, rows: list[dataset.Row], config: TrainConfig, review_threshold: float,
                      block_threshold: float) -> tuple[float | None, list[dict]]:
    """The lowest candidate floor whose verdicts on `rows` (the validation side: later traffic than the
    model learned from) keep the review band within `review_budget` of all posts and the legitimate posts
    flagged within `legit_flag_budget`; None when no candidate does. Every candidate's figures are returned
    so the model card shows what the choice cost and bought."""
    from modpipe.decision.engine import DecisionEngine

    if not rows:
        return None, []
    legit = sum(not r.spam for r in rows) or 1
    spam = sum(r.spam for r in rows) or 1
    candidates, chosen = [], None
    for floor in (None, *config.text_floors):
        engine = DecisionEngine(model, review_threshold, block_threshold, top_reasons=0, text_floor=floor)
        verdicts = cascade(engine, [r.features for r in rows])
        flagged = [v.verdict != "allow" for v in verdicts]
        entry = {"floor": floor,
                 "review_share": round(sum(v.verdict == "review" for v in verdicts) / len(rows), 4),
                 "legit_flagged": round(sum(f for f, r in zip(flagged, rows, strict=True) if not r.spam) / legit, 4),
                 "spam_caught": round(sum(f for f, r in zip(flagged, rows, strict=True) if r.spam) / spam, 4)}
        candidates.append(entry)
        if floor is not None and chosen is None and entry["review_share"] <= config.review_budget \
                and entry["legit_flagged"] <= config.legit_flag_budget:
            chosen = floor
    return chosen, candidates


def _simulation(settings: Settings, build: ModelBuild, config: TrainConfig, seed: int, progress: bool):
    texts = dataset.heldout_half(build.heldout(), "train")
    runs = list(progress_bar(simulated_runs(texts, config, seed), desc="simulate", unit="run", enabled=progress,
                             total=len(config.scenarios) * len(config.rates)))
    probs = dataset.TextProbabilities(build, decision_root(settings), progress=progress)
    probs.ensure(t for _, events in runs for t in dataset.post_texts(events))
    return runs, probs


def simulated_rows(settings: Settings, build: ModelBuild, config: TrainConfig, seed: int, decider: Decider, *,
                   progress: bool = True) -> list[dataset.Row]:
    """The training simulation replayed with `decider`'s blocks fed back (the prior of `--labels`)."""
    runs, probs = _simulation(settings, build, config, seed, progress)
    feedback = feedback_of(decider, settings.block_threshold)
    return [row for name, events in progress_bar(runs, desc="replay", unit="run", enabled=progress)
            for row in dataset.replay(events, probs, feedback, run=name)]


def feature_gain(booster) -> dict[str, float]:
    """Every decision feature's share of the booster's total split gain, largest first."""
    gain = booster.feature_importance("gain")
    total = float(gain.sum()) or 1.0
    ranked = sorted(zip(DECISION_FEATURES, gain, strict=True), key=lambda kv: -kv[1])
    return {name: round(float(g) / total, 4) for name, g in ranked}


def _importance(booster) -> dict[str, float]:
    return {name: g for name, g in list(feature_gain(booster).items())[:15] if g > 0}


def _point_current(root: Path, target: Path, text_model_version: str) -> None:
    """`current` -> the newest model; `for-<text model version>` -> the newest trained on that text model."""
    for name in ("current", f"for-{text_model_version}"):
        tmp = root / f".{name}-{os.getpid()}"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(target.name)
        tmp.replace(root / name)
