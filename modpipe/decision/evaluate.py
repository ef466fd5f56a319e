"""`modpipe decision eval`: the full engine beside the text model alone, on held-out load-generator traffic.

Held-out = the evaluation half of the text model's test-split texts (the decision model never saw
them) in simulations with seeds the training never used. Each scenario is replayed twice through the
feature code: with the text-only decider and with the full engine, each feeding its own blocks back
to the tables as the pipeline would. A post counts as flagged spam when its verdict is review or block
(spam_probability >= MODPIPE_REVIEW_THRESHOLD); block-only figures are reported beside.

Segments: `stealth` = campaign posts whose text is ham (only behaviour gives them away), `spam_text` =
campaign posts with spam text, `legit` = legitimate users; across them, `obfuscated` = campaign posts whose
text was disguised (scenario `obfuscated_campaign`) and `legit_obfuscated` = legitimate posts rewritten so.

`ablation` (`decision eval --ablation FEATURE,...`): trains the decision model twice on the same simulation
and seed, once with every feature and once without the named ones, and scores both side by side on the
same held-out traffic: does a feature group earn its place? (How the text-obfuscation features were
measured and left out: README, "Obfuscated texts".)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping

from modpipe.decision import dataset
from modpipe.decision.engine import DecisionEngine, cascade
from modpipe.decision.train import feedback_of
from modpipe.decision.verdict import Decider, ThresholdDecider
from modpipe.settings import Settings
from modpipe.textmodel.artifacts import ModelBuild
from simulation.metrics import binary_metrics

EVAL_SCENARIOS = ("mixed", "campaign_burst", "stealth_campaign", "hijacked_accounts", "human_spammers",
                  "obfuscated_campaign", "ham_only")
EVAL_SEED_OFFSET = 7_919  # seeds disjoint from training's (seed * 1000 + k, k < 1000)
F1_TARGET = 0.97


def segment(truth: dict) -> str:
    if truth.get("actor") != "spammer":
        return "legit"
    return "stealth" if truth.get("stealth") else "spam_text"


def score(rows: list[dataset.Row], decider: Decider) -> dict:
    verdicts = cascade(decider, [r.features for r in rows])
    truth = [r.spam for r in rows]
    flagged = [v.verdict != "allow" for v in verdicts]
    by_segment = {}
    groups = {seg: [i for i, r in enumerate(rows) if segment(r.truth) == seg]
              for seg in ("spam_text", "stealth", "legit")}
    groups["obfuscated"] = [i for i, r in enumerate(rows) if r.truth.get("obfuscated") and r.spam]
    groups["legit_obfuscated"] = [i for i, r in enumerate(rows) if r.truth.get("obfuscated") and not r.spam]
    for seg, idx in groups.items():
        if idx:
            caught = sum(flagged[i] for i in idx)
            by_segment[seg] = {"posts": len(idx), "flagged": caught, "flagged_share": round(caught / len(idx), 4)}
    shortcuts = Counter(v.short_circuit for v in verdicts if v.short_circuit)
    return {
        "posts": len(rows),
        "flagged": binary_metrics(truth, flagged),
        "block": binary_metrics(truth, [v.verdict == "block" for v in verdicts]),
        "verdict_mix": dict(Counter(v.verdict for v in verdicts)),
        "shortcuts": dict(shortcuts),
        "shortcut_rate": round(sum(shortcuts.values()) / len(rows), 4) if rows else None,
        "segments": by_segment,
    }


def replay_scores(settings: Settings, build: ModelBuild, deciders: Mapping[str, Decider], *, n_posts: int,
                  rate: float, seed: int, scenarios, progress: bool) -> tuple[dict, dict]:
    """Held-out traffic of each scenario replayed once per decider (each feeding back its own blocks):
    ({scenario: {label: score}}, {label: score over every scenario})."""
    from tqdm import tqdm

    texts = dataset.heldout_half(build.heldout(), "eval")
    runs = {s: dataset.simulate(texts, s, EVAL_SEED_OFFSET + seed, n_posts, rate) for s in scenarios}
    probs = dataset.TextProbabilities(build, settings.cache_dir / "decision")
    probs.ensure(t for events in runs.values() for t in dataset.post_texts(events))
    per_scenario: dict = {}
    all_rows: dict[str, list[dataset.Row]] = {label: [] for label in deciders}
    for name, events in tqdm(runs.items(), desc="replay", unit="scenario", disable=not progress):
        entry = {}
        for label, decider in deciders.items():
            rows = dataset.replay(events, probs, feedback_of(decider, settings.block_threshold), run=name)
            entry[label] = score(rows, decider)
            all_rows[label] += rows
        per_scenario[name] = entry
    return per_scenario, {label: score(rows, deciders[label]) for label, rows in all_rows.items()}


def evaluate(settings: Settings, build: ModelBuild, engine: DecisionEngine, *, n_posts: int = 1500,
             rate: float = 50.0, seed: int = 0, scenarios=EVAL_SCENARIOS, progress: bool = True) -> dict:
    text_only = ThresholdDecider(settings.review_threshold, settings.block_threshold)
    per_scenario, overall = replay_scores(settings, build, {"text_only": text_only, "engine": engine},
                                          n_posts=n_posts, rate=rate, seed=seed, scenarios=scenarios,
                                          progress=progress)
    report: dict = {"decision_model": engine.version, "text_model": build.version, "posts_per_scenario": n_posts,
                    "rate": rate, "thresholds": {"review": engine.review_threshold, "block": engine.block_threshold},
                    "scenarios": per_scenario, "overall": overall}
    stealth = {label: overall[label]["segments"].get("stealth", {}).get("flagged_share") for label in overall}
    report["targets"] = {
        "engine_f1_overall": {"target": F1_TARGET, "value": overall["engine"]["flagged"]["f1"],
                              "met": (overall["engine"]["flagged"]["f1"] or 0) >= F1_TARGET},
        "stealth_recall_engine_vs_text_only": {"engine": stealth["engine"], "text_only": stealth["text_only"],
                                               "met": (stealth["engine"] or 0) > (stealth["text_only"] or 0) + 0.2},
    }
    return report


def _cell(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _caught(entry: dict, seg: str):
    """A segment's flagged share in one decider's score (None when the scenario has no such posts)."""
    return entry["segments"].get(seg, {}).get("flagged_share")


def format_table(report: dict) -> str:
    f = _cell
    lines = [f"decision model {report['decision_model']} over text model {report['text_model']}; "
             f"{report['posts_per_scenario']} posts per scenario at {report['rate']:g}/s",
             "| scenario | text-only F1 | engine F1 | engine block F1 | stealth caught (text / engine) | "
             "obfuscated caught (text / engine) | shortcut rate | engine verdicts (allow/review/block) |",
             "|---|---|---|---|---|---|---|---|"]
    rows = list(report["scenarios"].items()) + [("overall", report["overall"])]
    for name, e in rows:
        t, g = e["text_only"], e["engine"]
        mix = g["verdict_mix"]
        lines.append(f"| {name} | {f(t['flagged']['f1'])} | {f(g['flagged']['f1'])} | {f(g['block']['f1'])} | "
                     f"{f(_caught(t, 'stealth'))} / {f(_caught(g, 'stealth'))} | "
                     f"{f(_caught(t, 'obfuscated'))} / {f(_caught(g, 'obfuscated'))} | {f(g['shortcut_rate'])} | "
                     f"{mix.get('allow', 0)}/{mix.get('review', 0)}/{mix.get('block', 0)} |")
    return "\n".join(lines)


def ablation(settings: Settings, build: ModelBuild, drop: Collection[str], *, profile: str = "full",
             train_seed: int = 0, n_posts: int = 1500, rate: float = 50.0, seed: int = 0, scenarios=EVAL_SCENARIOS,
             progress: bool = True) -> dict:
    """The decision model trained twice on the same simulation and seed (every feature / without `drop`),
    in memory (nothing is cached or served), both scored beside the text-only decider on the same held-out
    traffic. A feature group earns its place when `engine` beats `engine_without` where it should and is
    no worse elsewhere."""
    from modpipe.decision.model import DECISION_FEATURES, DecisionModel
    from modpipe.decision.train import PROFILES, _simulation, feature_gain, train_rounds

    config = PROFILES[profile]
    drop = tuple(drop)
    unknown = [name for name in drop if name not in DECISION_FEATURES]
    if not drop or unknown:
        raise ValueError(f"name decision features to leave out (unknown: {unknown}); see DECISION_FEATURES")
    runs, probs = _simulation(settings, build, config, train_seed, progress)
    deciders: dict[str, Decider] = {"text_only": ThresholdDecider(settings.review_threshold, settings.block_threshold)}
    versions, gain = {}, {}
    for label, dropped in (("engine", ()), ("engine_without", drop)):
        booster, _ = train_rounds(settings, runs, probs, config, train_seed, progress=progress, drop=dropped)
        model = DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster))
        deciders[label] = DecisionEngine(model, settings.review_threshold, settings.block_threshold)
        versions[label] = model.version
        gain[label] = feature_gain(booster)
    per_scenario, overall = replay_scores(settings, build, deciders, n_posts=n_posts, rate=rate, seed=seed,
                                          scenarios=scenarios, progress=progress)
    return {"ablation": list(drop), "text_model": build.version, "profile": profile, "train_seed": train_seed,
            "decision_models": versions, "dropped_gain_share": round(sum(gain["engine"][n] for n in drop), 4),
            "top_gain": {label: dict(list(g.items())[:8]) for label, g in gain.items()},
            "posts_per_scenario": n_posts, "rate": rate, "scenarios": per_scenario,
            "overall": overall}


def format_ablation(report: dict) -> str:
    f = _cell

    def obf(e):
        return _caught(e, "obfuscated")

    lines = [f"decision model with / without {', '.join(report['ablation'])} (trained side by side, profile "
             f"{report['profile']}, seed {report['train_seed']}) over text model {report['text_model']}; "
             f"{report['posts_per_scenario']} posts per scenario at {report['rate']:g}/s; the dropped features carry "
             f"{report['dropped_gain_share']:.1%} of the full model's gain",
             "| scenario | text-only F1 | engine F1 | engine F1 without | "
             "obfuscated caught (text / engine / without) |",
             "|---|---|---|---|---|"]
    for name, e in list(report["scenarios"].items()) + [("overall", report["overall"])]:
        t, g, w = e["text_only"], e["engine"], e["engine_without"]
        lines.append(f"| {name} | {f(t['flagged']['f1'])} | {f(g['flagged']['f1'])} | {f(w['flagged']['f1'])} | "
                     f"{f(obf(t))} / {f(obf(g))} / {f(obf(w))} |")
    return "\n".join(lines)
