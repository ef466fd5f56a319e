"""`modpipe decision eval`: the full engine beside the text model alone, on held-out load-generator traffic.

Held-out = the evaluation half of the text model's test-split texts (the decision model never saw
them) in simulations with seeds the training never used. Each scenario is replayed twice through the
feature code: with the text-only decider and with the full engine, each feeding its own blocks back
to the tables as the pipeline would. A post counts as flagged spam when its verdict is review or block
(spam_probability >= MODPIPE_REVIEW_THRESHOLD); block-only figures are reported beside.

Segments: `stealth` = campaign posts whose text is ham (only behaviour gives them away), `spam_text` =
campaign posts with spam text, `legit` = legitimate users.
"""

from __future__ import annotations

from collections import Counter

from loadgen.measure import binary_metrics
from modpipe.decision import dataset
from modpipe.decision.engine import DecisionEngine, cascade
from modpipe.decision.train import feedback_of
from modpipe.decision.verdict import Decider, ThresholdDecider
from modpipe.settings import Settings
from modpipe.textmodel.artifacts import ModelBuild

EVAL_SCENARIOS = ("mixed", "campaign_burst", "stealth_campaign", "hijacked_accounts", "human_spammers", "ham_only")
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
    for seg in ("spam_text", "stealth", "legit"):
        idx = [i for i, r in enumerate(rows) if segment(r.truth) == seg]
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


def evaluate(settings: Settings, build: ModelBuild, engine: DecisionEngine, *, n_posts: int = 1500,
             rate: float = 50.0, seed: int = 0, scenarios=EVAL_SCENARIOS, progress: bool = True) -> dict:
    from tqdm import tqdm

    texts = dataset.heldout_half(build.heldout(), "eval")
    text_only = ThresholdDecider(settings.review_threshold, settings.block_threshold)
    runs = {s: dataset.simulate(texts, s, EVAL_SEED_OFFSET + seed, n_posts, rate) for s in scenarios}
    probs = dataset.TextProbabilities(build, settings.cache_dir / "decision")
    probs.ensure(t for events in runs.values() for t in dataset.post_texts(events))
    report: dict = {"decision_model": engine.version, "text_model": build.version, "posts_per_scenario": n_posts,
                    "rate": rate, "thresholds": {"review": engine.review_threshold, "block": engine.block_threshold},
                    "scenarios": {}}
    all_rows: dict[str, list[dataset.Row]] = {"text_only": [], "engine": []}
    for name, events in tqdm(runs.items(), desc="replay", unit="scenario", disable=not progress):
        entry = {}
        for label, decider in (("text_only", text_only), ("engine", engine)):
            rows = dataset.replay(events, probs, feedback_of(decider, settings.block_threshold), run=name)
            entry[label] = score(rows, decider)
            all_rows[label] += rows
        report["scenarios"][name] = entry
    overall = {label: score(rows, text_only if label == "text_only" else engine) for label, rows in all_rows.items()}
    report["overall"] = overall
    stealth = {label: overall[label]["segments"].get("stealth", {}).get("flagged_share") for label in overall}
    report["targets"] = {
        "engine_f1_overall": {"target": F1_TARGET, "value": overall["engine"]["flagged"]["f1"],
                              "met": (overall["engine"]["flagged"]["f1"] or 0) >= F1_TARGET},
        "stealth_recall_engine_vs_text_only": {"engine": stealth["engine"], "text_only": stealth["text_only"],
                                               "met": (stealth["engine"] or 0) > (stealth["text_only"] or 0) + 0.2},
    }
    return report


def format_table(report: dict) -> str:
    def f(x):
        return "-" if x is None else f"{x:.3f}"

    lines = [f"decision model {report['decision_model']} over text model {report['text_model']}; "
             f"{report['posts_per_scenario']} posts per scenario at {report['rate']:g}/s",
             "| scenario | text-only F1 | engine F1 | engine block F1 | stealth caught (text / engine) | "
             "shortcut rate | engine verdicts (allow/review/block) |",
             "|---|---|---|---|---|---|---|"]
    rows = list(report["scenarios"].items()) + [("overall", report["overall"])]
    for name, e in rows:
        t, g = e["text_only"], e["engine"]
        st = (t["segments"].get("stealth", {}).get("flagged_share"), g["segments"].get("stealth", {}).get("flagged_share"))
        mix = g["verdict_mix"]
        lines.append(f"| {name} | {f(t['flagged']['f1'])} | {f(g['flagged']['f1'])} | {f(g['block']['f1'])} | "
                     f"{f(st[0])} / {f(st[1])} | {f(g['shortcut_rate'])} | "
                     f"{mix.get('allow', 0)}/{mix.get('review', 0)}/{mix.get('block', 0)} |")
    return "\n".join(lines)
