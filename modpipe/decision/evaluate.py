"""`modpipe decision eval`: the full engine beside the text model alone, on held-out load-generator traffic.

Held-out = the evaluation half of the text model's test-split texts (the decision model never saw
them) in simulations with seeds the training never used. Each scenario is replayed twice through the
feature code: with the text-only decider and with the full engine, each feeding its own blocks back
to the tables as the pipeline would. A post counts as flagged spam when its verdict is review or block
(spam_probability >= MODPIPE_REVIEW_THRESHOLD); block-only figures are reported beside.

Segments: `stealth` = campaign posts whose text is ham (only behaviour gives them away), `spam_text` =
campaign posts with spam text, `legit` = legitimate users; across them, `obfuscated` = campaign posts whose
text was disguised (scenario `obfuscated_campaign`) and `legit_obfuscated` = legitimate posts rewritten so;
`lure_<dataset>` = spam posted by people without a link (scenarios `human_lures`, `taken_over_lures`) and
`lure_link_<dataset>` with one (`link_lures`, `business_commerce`), by the data set its text came from;
`business` = legitimate posts of businesses promoting their shops (`business_commerce`); `legit_<dataset>` =
legitimate users' posts by the data set (register) their text came from.

Registers (`register_targets`): per data set, pooled over every scenario, the spam posted as lures (with and
without a link) that the engine catches and the legitimate posts it flags, beside the text model alone: the
engine must catch at least as many as its text model and flag no more (beyond one seed's noise: 2 posts and 1%),
on every register of today's platforms and the older corpora alike.

Account segments (`account_segment`): what the decider sees of the poster, account age band x link or
none x journey kind, read from the feature map itself, so the same table works on labelled production
traffic. Per segment: spam caught and legitimate posts flagged, by the engine and by the text model alone;
a segment where the engine catches less spam than the text model alone is the engine being deaf to the
text (`segment_table` marks it). With `--before`, every segment (account and truth segments, pooled over the
scenarios) is compared with the earlier decision model on the same posts (`segments_vs_before`): a new model
must not lose spam that links and behaviour told the earlier one, nor flag more legitimate posts.

`ablation` (`decision eval --ablation FEATURE,...`): trains the decision model twice on the same simulation
and seed, once with every feature and once without the named ones, and scores both side by side on the
same held-out traffic: does a feature group earn its place? (How the text-obfuscation features were
measured and left out: docs/decision-engine.md, "Obfuscated texts".)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from modpipe.decision import dataset
from modpipe.decision.engine import DecisionEngine, cascade
from modpipe.decision.train import feedback_of
from modpipe.decision.verdict import Decider, ThresholdDecider
from modpipe.settings import Settings
from modpipe.simulation.metrics import binary_metrics
from modpipe.simulation.simulator import can_run
from modpipe.textmodel.artifacts import ModelBuild

EVAL_SCENARIOS = ("mixed", "campaign_burst", "stealth_campaign", "hijacked_accounts", "human_spammers",
                  "obfuscated_campaign", "human_lures", "taken_over_lures", "link_lures", "platform_lures",
                  "business_commerce", "ham_only")
LURE_SCENARIOS = ("human_lures", "taken_over_lures", "link_lures", "platform_lures", "business_commerce")
BUSINESS_FLAG_TARGET = 0.01  # businesses' legitimate posts flagged
# A segment counts as worse than `before` beyond this many posts and this share of it (one seed's noise).
BEFORE_SLACK_POSTS, BEFORE_SLACK_SHARE = 2, 0.01
# (upper bound in days, band): the bands the issue of link-less lures is stated in
AGE_BANDS = ((2.0, "new <2d"), (30.0, "young 2-30d"), (400.0, "aged 30-400d"), (float("inf"), "old >400d"))
SCRIPTED_STEP_MS = 100  # no step of a person's journey is this short (the shortest, a submit click, ~120 ms+)
EVAL_SEED_OFFSET = 7_919  # seeds disjoint from training's (seed * 1000 + k, k < 1000)
F1_TARGET = 0.97


def segment(truth: dict) -> str:
    if truth.get("actor") != "spammer":
        return "legit"
    return "stealth" if truth.get("stealth") else "spam_text"


def age_band(age_days) -> str:
    if not dataset.finite(age_days):
        return "age unknown"
    return next(band for bound, band in AGE_BANDS if age_days < bound)


def journey_kind(features: dict) -> str:
    """`none` (no journey: an API post), `scripted` (faster than a person) or `human`."""
    if not features.get("journey_steps"):
        return "none"
    min_step = features.get("journey_min_step_ms")
    if features.get("journey_submit_without_typing") or (dataset.finite(min_step) and min_step < SCRIPTED_STEP_MS):
        return "scripted"
    return "human"


def account_segment(features: dict) -> str:
    link = "link" if features.get("url_present") else "no link"
    return f"{age_band(features.get('user_age'))} | {link} | {journey_kind(features)}"


def _account_segments(rows: list[dataset.Row], flagged: list[bool]) -> dict:
    out: dict[str, dict[str, int]] = {}
    for row, hit in zip(rows, flagged, strict=True):
        seg = out.setdefault(account_segment(row.features),
                             {"spam": 0, "spam_flagged": 0, "legit": 0, "legit_flagged": 0})
        kind = "spam" if row.spam else "legit"
        seg[kind] += 1
        seg[f"{kind}_flagged"] += hit
    return dict(sorted(out.items()))


def score(rows: list[dataset.Row], decider: Decider) -> dict:
    verdicts = cascade(decider, [r.features for r in rows])
    truth = [r.spam for r in rows]
    flagged = [v.verdict != "allow" for v in verdicts]
    by_segment = {}
    groups = {seg: [i for i, r in enumerate(rows) if segment(r.truth) == seg]
              for seg in ("spam_text", "stealth", "legit")}
    groups["obfuscated"] = [i for i, r in enumerate(rows) if r.truth.get("obfuscated") and r.spam]
    groups["legit_obfuscated"] = [i for i, r in enumerate(rows) if r.truth.get("obfuscated") and not r.spam]
    groups["business"] = [i for i, r in enumerate(rows) if r.truth.get("business") and not r.spam]
    registers: dict[str, dict[str, dict[str, int]]] = {}  # counted apart: never parsed back out of segment names
    for i, r in enumerate(rows):
        register = r.truth.get("dataset") or "unknown"
        if r.truth.get("lure"):
            kind = "lure_link" if r.truth.get("lure_link") else "lure"
            groups.setdefault(f"{kind}_{register}", []).append(i)
            cell = registers.setdefault(register, {}).setdefault("spam", {"posts": 0, "flagged": 0})
        elif not r.spam and segment(r.truth) == "legit" and not r.truth.get("business"):
            groups.setdefault(f"legit_{register}", []).append(i)
            cell = registers.setdefault(register, {}).setdefault("legit", {"posts": 0, "flagged": 0})
        else:
            continue
        cell["posts"] += 1
        cell["flagged"] += flagged[i]
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
        "registers": dict(sorted(registers.items())),
        "account_segments": _account_segments(rows, flagged),
    }


def eval_texts(build: ModelBuild, datasets: Collection[str] | None = None) -> list[dict]:
    """The held-out texts evaluation traffic is drawn from; `datasets`: only these data sets' texts, so that two
    text builds of which one tests on a data set the other lacks replay the same posts (names it lacks refused)."""
    texts = dataset.heldout_half(build.heldout(), "eval")
    if datasets is None:
        return texts
    wanted = set(datasets)
    known = sorted({r.get("dataset") for r in texts})
    unknown = sorted(wanted - set(known))
    if unknown or not wanted:
        raise ValueError(f"no held-out texts of data sets {unknown or '(none named)'} in {build.version} "
                         f"(it has {', '.join(map(str, known))})")
    return [r for r in texts if r.get("dataset") in wanted]


def replay_scores(settings: Settings, build: ModelBuild, deciders: Mapping[str, Decider], *, n_posts: int,
                  rate: float, seed: int, scenarios, progress: bool,
                  datasets: Collection[str] | None = None) -> tuple[dict, dict]:
    """Held-out traffic of each scenario replayed once per decider (each feeding back its own blocks):
    ({scenario: {label: score}}, {label: score over every scenario})."""
    from modpipe.output import progress_bar

    texts = eval_texts(build, datasets)
    runs = {s: dataset.simulate(texts, s, EVAL_SEED_OFFSET + seed, n_posts, rate) for s in scenarios
            if can_run(s, texts)}  # a scenario of named data sets needs them in the traffic's texts
    probs = dataset.TextProbabilities(build, settings.cache_dir / "decision", progress=progress)
    probs.ensure(t for events in runs.values() for t in dataset.post_texts(events))
    per_scenario: dict = {}
    all_rows: dict[str, list[dataset.Row]] = {label: [] for label in deciders}
    for name, events in progress_bar(runs.items(), desc="replay", unit="scenario", enabled=progress):
        entry = {}
        for label, decider in deciders.items():
            rows = dataset.replay(events, probs, feedback_of(decider, settings.block_threshold), run=name)
            entry[label] = score(rows, decider)
            all_rows[label] += rows
        per_scenario[name] = entry
    return per_scenario, {label: score(rows, deciders[label]) for label, rows in all_rows.items()}


def evaluate(settings: Settings, build: ModelBuild, engine: DecisionEngine, *, n_posts: int = 1500,
             rate: float = 50.0, seed: int = 0, scenarios=EVAL_SCENARIOS, progress: bool = True,
             before: DecisionEngine | None = None, datasets: Collection[str] | None = None) -> dict:
    """`before`: another decision model (an earlier one) scored on the same traffic in the same run;
    `datasets`: traffic drawn from these data sets' held-out texts only (`eval_texts`)."""
    text_only = ThresholdDecider(settings.review_threshold, settings.block_threshold)
    deciders: dict[str, Decider] = {"text_only": text_only, "engine": engine}
    if before is not None:
        deciders["before"] = before
    per_scenario, overall = replay_scores(settings, build, deciders, n_posts=n_posts, rate=rate, seed=seed,
                                          scenarios=scenarios, progress=progress, datasets=datasets)
    report: dict = {"decision_model": engine.version, "text_model": build.version, "posts_per_scenario": n_posts,
                    "rate": rate, "datasets": sorted(datasets) if datasets is not None else "all",
                    "thresholds": {"review": engine.review_threshold, "block": engine.block_threshold},
                    "text_floor": engine.text_floor, "scenarios": per_scenario, "overall": overall}
    if before is not None:
        report["before"] = {"decision_model": before.version, "text_floor": before.text_floor,
                            "targets": lure_targets(per_scenario, "before"),
                            "segments_vs_before": segments_vs_before(per_scenario)}
    stealth = {label: overall[label]["segments"].get("stealth", {}).get("flagged_share") for label in overall}
    report["targets"] = {
        "engine_f1_overall": {"target": F1_TARGET, "value": overall["engine"]["flagged"]["f1"],
                              "met": (overall["engine"]["flagged"]["f1"] or 0) >= F1_TARGET},
        "stealth_recall_engine_vs_text_only": {"engine": stealth["engine"], "text_only": stealth["text_only"],
                                               "met": (stealth["engine"] or 0) > (stealth["text_only"] or 0) + 0.2},
        **lure_targets(per_scenario),
        "registers_engine_vs_text_only": register_targets(per_scenario),
    }
    return report


def register_targets(per_scenario: dict, label: str = "engine") -> dict:
    """Per register (the data set a post's text came from), pooled over the scenarios: lures caught (with a link
    or without) and legitimate users' posts flagged, by the text model alone and by the engine (`score`'s
    "registers", counted by data set name, whatever that name is). Met when on no register the engine catches
    fewer lures or flags more legitimate posts than the text model alone, beyond one seed's noise (the slack
    `segments_vs_before` allows: 2 posts and 1%; the table gives the counts either way)."""
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for entry in per_scenario.values():
        for who in ("text_only", label):
            for reg, kinds in entry[who]["registers"].items():
                for kind, c in kinds.items():
                    cell = counts.setdefault(reg, {}).setdefault(kind, {"posts": 0, "text_only": 0, label: 0})
                    if who == "text_only":
                        cell["posts"] += c["posts"]
                    cell[who] += c["flagged"]
    registers, below = {}, []
    for reg in sorted(counts):
        row = {}
        for kind, c in sorted(counts[reg].items()):
            row[kind] = {"posts": c["posts"], "text_only": _share(c["text_only"], c["posts"]),
                         label: _share(c[label], c["posts"])}
            delta = c["text_only"] - c[label] if kind == "spam" else c[label] - c["text_only"]
            if delta > max(BEFORE_SLACK_POSTS, BEFORE_SLACK_SHARE * c["posts"]):
                below.append(f"{reg} {kind}")
        registers[reg] = row
    return {"registers": registers, "engine_worse_than_text": below, "met": not below,
            "slack": {"posts": BEFORE_SLACK_POSTS, "share": BEFORE_SLACK_SHARE}}


def _share(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def deaf_segments(segments: dict[str, dict[str, dict]], label: str = "engine") -> list[str]:
    """Account segments where the decider `label` caught fewer spam posts than the text model alone."""
    text, engine = segments["text_only"], segments[label]
    return [seg for seg, e in engine.items() if e["spam_flagged"] < text.get(seg, {}).get("spam_flagged", 0)]


def pooled_segments(entries: list[dict]) -> dict[str, dict[str, dict]]:
    """{decider: {account segment: counts}} summed over several scenarios' scores."""
    out: dict[str, dict[str, dict]] = {}
    for entry in entries:
        for label, sc in entry.items():
            for seg, counts in sc["account_segments"].items():
                acc = out.setdefault(label, {}).setdefault(seg, dict.fromkeys(counts, 0))
                for k, v in counts.items():
                    acc[k] += v
    return {label: dict(sorted(segs.items())) for label, segs in out.items()}


def segments_vs_before(per_scenario: dict, label: str = "engine") -> dict:
    """Every account segment and truth segment, pooled over the scenarios: spam caught and legitimate posts
    flagged by `label` and by `before` on the same posts; `worse` lists the segments where `label` catches
    fewer spam posts or flags more legitimate ones than `before` by more than BEFORE_SLACK_POSTS posts and
    BEFORE_SLACK_SHARE of the segment (one seed's noise)."""
    entries = list(per_scenario.values())
    out: dict[str, dict] = {}
    pooled = pooled_segments(entries)
    for seg, counts in pooled[label].items():
        old = pooled["before"][seg]
        out[f"account: {seg}"] = {"spam": counts["spam"], "spam_flagged": counts["spam_flagged"],
                                  "before_spam_flagged": old["spam_flagged"], "legit": counts["legit"],
                                  "legit_flagged": counts["legit_flagged"], "before_legit_flagged": old["legit_flagged"]}
    truth: dict[str, dict] = {}
    for e in entries:
        for seg, v in e[label]["segments"].items():
            acc = truth.setdefault(seg, {"posts": 0, "flagged": 0, "before_flagged": 0})
            acc["posts"] += v["posts"]
            acc["flagged"] += v["flagged"]
            acc["before_flagged"] += e["before"]["segments"].get(seg, {}).get("flagged", 0)
    spam_truth = {"spam_text", "stealth", "obfuscated"}
    for seg, v in sorted(truth.items()):
        spam = seg in spam_truth or seg.startswith("lure")
        out[f"truth: {seg}"] = {"spam": v["posts"], "spam_flagged": v["flagged"], "before_spam_flagged": v["before_flagged"],
                                "legit": 0, "legit_flagged": 0, "before_legit_flagged": 0} if spam else \
            {"spam": 0, "spam_flagged": 0, "before_spam_flagged": 0, "legit": v["posts"], "legit_flagged": v["flagged"],
             "before_legit_flagged": v["before_flagged"]}

    def beyond(delta: int, n: int) -> bool:
        return delta > max(BEFORE_SLACK_POSTS, BEFORE_SLACK_SHARE * n)

    worse = [seg for seg, v in out.items()
             if beyond(v["before_spam_flagged"] - v["spam_flagged"], v["spam"])
             or beyond(v["legit_flagged"] - v["before_legit_flagged"], v["legit"])]
    return {"segments": out, "worse": worse, "met": not worse,
            "slack": {"posts": BEFORE_SLACK_POSTS, "share": BEFORE_SLACK_SHARE}}


def evaluate_seeds(settings: Settings, build: ModelBuild, engine: DecisionEngine, *, seeds: Sequence[int],
                   before: DecisionEngine | None = None, **kwargs) -> dict:
    """`evaluate` once per evaluation seed, and each decider's F1 per scenario over the seeds (per seed, mean,
    min, max). One seed's traffic moves overall engine F1 by up to ~0.003 and a scenario by up to ~0.03
    (docs/decision-engine.md), as much as a change of text model: a comparison reads the mean, and each scenario."""
    reports = [evaluate(settings, build, engine, seed=seed, before=before, **kwargs) for seed in seeds]
    labels = [x for x in ("text_only", "before", "engine") if x in reports[0]["overall"]]
    f1: dict = {}
    for name in [*reports[0]["scenarios"], "overall"]:
        f1[name] = {}
        for label in labels:
            values = [(r["overall"] if name == "overall" else r["scenarios"][name])[label]["flagged"]["f1"]
                      for r in reports]
            known = [v for v in values if v is not None]
            f1[name][label] = {"per_seed": values,
                               "mean": round(float(np.mean(known)), 4) if known else None,
                               "min": min(known, default=None), "max": max(known, default=None)}
    out = {"decision_model": engine.version, "text_model": build.version, "seeds": list(seeds),
           "datasets": reports[0]["datasets"],
           "posts_per_scenario": reports[0]["posts_per_scenario"], "rate": reports[0]["rate"],
           "f1": f1, "reports": reports}
    if before is not None:  # every segment over every seed's posts: more posts per segment than one seed has
        out["before"] = {"decision_model": before.version, "segments_vs_before": segments_vs_before(
            {f"{name}#{seed}": entry for seed, r in zip(seeds, reports, strict=True)
             for name, entry in r["scenarios"].items()})}
    return out


def _datasets_suffix(report: dict) -> str:
    """The report header's note of traffic drawn from named data sets only (`--datasets`)."""
    datasets = report.get("datasets", "all")
    return "" if datasets == "all" else f"; texts of {', '.join(datasets)} only"


def format_seeds(report: dict) -> str:
    labels = [x for x in ("text_only", "before", "engine") if x in report["f1"]["overall"]]
    seeds = " / ".join(str(s) for s in report["seeds"])
    lines = [f"decision model {report['decision_model']} over text model {report['text_model']}; "
             f"{report['posts_per_scenario']} posts per scenario at {report['rate']:g}/s; evaluation seeds {seeds}"
             + _datasets_suffix(report),
             "| scenario | " + " | ".join(f"{label} F1 per seed | {label} mean" for label in labels) + " |",
             "|---|" + "---|---|" * len(labels)]
    for name, per in report["f1"].items():
        cells = [f"{' / '.join(_cell(v) for v in per[x]['per_seed'])} | {_cell(per[x]['mean'])}" for x in labels]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if "before" in report:
        lines += ["", before_table(report["before"]["segments_vs_before"], report["before"]["decision_model"])]
    return "\n".join(lines)


def lure_targets(per_scenario: dict, label: str = "engine") -> dict:
    """The engine must never know less than its own text model: link-less lures from ordinary-looking
    accounts caught as often as the text model alone catches them (every account segment) and >= 0.90 of
    them overall; legitimate posts of the same kinds of accounts <= 2% flagged; the review band of `mixed`
    <= 3% of its posts; every campaign scenario keeps engine F1 >= 0.99."""
    targets: dict = {}
    lures = [per_scenario[s] for s in LURE_SCENARIOS if s in per_scenario]
    if lures:
        segs = pooled_segments(lures)
        deaf = deaf_segments(segs, label)
        targets["lure_segments_engine_at_least_text"] = {"deaf_segments": deaf, "met": not deaf}
        for name in sorted({k for e in lures for k in e[label]["segments"] if k.startswith("lure_")}):
            posts = sum(e[label]["segments"].get(name, {}).get("posts", 0) for e in lures)
            caught = {who: sum(e[who]["segments"].get(name, {}).get("flagged", 0) for e in lures)
                      for who in ("text_only", label)}
            value = _share(caught[label], posts)
            targets[f"{name}_caught"] = {"target": 0.90, "posts": posts, "text_only": _share(caught["text_only"], posts),
                                         label: value, "met": (value or 0) >= 0.90}
        legit = {who: [sum(c["legit"] for c in segs[who].values()),
                       sum(c["legit_flagged"] for c in segs[who].values())] for who in ("text_only", label)}
        value = _share(legit[label][1], legit[label][0])
        targets["lure_scenarios_legit_flagged"] = {"target": 0.02, "posts": legit[label][0],
                                                   "text_only": _share(legit["text_only"][1], legit["text_only"][0]),
                                                   label: value, "met": value is not None and value <= 0.02}
    business = [per_scenario[s] for s in per_scenario if "business" in per_scenario[s][label]["segments"]]
    if business:
        posts = sum(e[label]["segments"]["business"]["posts"] for e in business)
        flagged = {who: sum(e[who]["segments"]["business"]["flagged"] for e in business) for who in ("text_only", label)}
        value = _share(flagged[label], posts)
        targets["business_posts_flagged"] = {"target": BUSINESS_FLAG_TARGET, "posts": posts,
                                             "text_only": _share(flagged["text_only"], posts), label: value,
                                             "met": value is not None and value <= BUSINESS_FLAG_TARGET}
    if "mixed" in per_scenario:
        mixed = per_scenario["mixed"][label]
        value = _share(mixed["verdict_mix"].get("review", 0), mixed["posts"])
        targets["mixed_review_band"] = {"target": 0.03, "value": value, "met": value is not None and value <= 0.03}
    campaign = {s: per_scenario[s][label]["flagged"]["f1"] for s in per_scenario
                if s not in LURE_SCENARIOS and s != "ham_only"}
    if campaign:
        targets["campaign_scenarios_engine_f1"] = {"target": 0.99, "values": campaign,
                                                   "met": all((f or 0) >= 0.99 for f in campaign.values())}
    return targets


def _cell(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def _caught(entry: dict, seg: str):
    """A segment's flagged share in one decider's score (None when the scenario has no such posts)."""
    return entry["segments"].get(seg, {}).get("flagged_share")


def format_table(report: dict) -> str:
    f = _cell
    before = "before" in report
    head = f"decision model {report['decision_model']} (text floor {report.get('text_floor')})"
    if before:
        head += f", earlier model {report['before']['decision_model']} as `before`"
    lines = [f"{head}, over text model {report['text_model']}; "
             f"{report['posts_per_scenario']} posts per scenario at {report['rate']:g}/s" + _datasets_suffix(report),
             "| scenario | text-only F1 | " + ("before F1 | " if before else "") + "engine F1 | engine block F1 | "
             "stealth caught (text / engine) | obfuscated caught (text / engine) | lures caught (text / " +
             ("before / " if before else "") + "engine) | shortcut rate | engine verdicts (allow/review/block) |",
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if before else "")]
    rows = list(report["scenarios"].items()) + [("overall", report["overall"])]
    for name, e in rows:
        t, g = e["text_only"], e["engine"]
        mix = g["verdict_mix"]
        lure = " / ".join(f(_lures_caught(e[x])) for x in ("text_only", "before", "engine") if x in e)
        lines.append(f"| {name} | {f(t['flagged']['f1'])} | " +
                     (f"{f(e['before']['flagged']['f1'])} | " if before else "") +
                     f"{f(g['flagged']['f1'])} | {f(g['block']['f1'])} | "
                     f"{f(_caught(t, 'stealth'))} / {f(_caught(g, 'stealth'))} | "
                     f"{f(_caught(t, 'obfuscated'))} / {f(_caught(g, 'obfuscated'))} | {lure} | "
                     f"{f(g['shortcut_rate'])} | {mix.get('allow', 0)}/{mix.get('review', 0)}/{mix.get('block', 0)} |")
    return "\n".join(lines)


def _lures_caught(entry: dict) -> float | None:
    segs = [v for k, v in entry["segments"].items() if k.startswith("lure_")]
    return _share(sum(v["flagged"] for v in segs), sum(v["posts"] for v in segs))


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
        booster, rounds = train_rounds(settings, runs, probs, config, train_seed, progress=progress, drop=dropped)
        model = DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster))
        deciders[label] = DecisionEngine(model, settings.review_threshold, settings.block_threshold,
                                         text_floor=rounds[-1]["text_floor"]["chosen"])
        versions[label] = model.version
        gain[label] = feature_gain(booster)
    per_scenario, overall = replay_scores(settings, build, deciders, n_posts=n_posts, rate=rate, seed=seed,
                                          scenarios=scenarios, progress=progress)
    return {"ablation": list(drop), "text_model": build.version, "profile": profile, "train_seed": train_seed,
            "decision_models": versions, "dropped_gain_share": round(sum(gain["engine"][n] for n in drop), 4),
            "top_gain": {label: dict(list(g.items())[:8]) for label, g in gain.items()},
            "posts_per_scenario": n_posts, "rate": rate, "scenarios": per_scenario,
            "overall": overall}


def segment_table(segments: dict[str, dict[str, dict]], title: str) -> str:
    """Per account segment: spam caught and legitimate posts flagged by the text model alone, the earlier
    model (when scored) and the engine; `<` marks a segment where the engine catches less spam than the
    text model alone."""
    f = _cell
    labels = [label for label in ("text_only", "before", "engine") if label in segments]
    names = " / ".join({"text_only": "text", "before": "before", "engine": "engine"}[x] for x in labels)
    lines = [title, f"| account age | link | journey | spam | caught: {names} | legit | flagged: {names} | |",
             "|---|---|---|---|---|---|---|---|"]
    for seg, g in segments["engine"].items():
        mark = "<" if g["spam_flagged"] < segments["text_only"][seg]["spam_flagged"] else ""
        age, link, journey = seg.split(" | ")
        caught = " / ".join(f(_share(segments[x][seg]["spam_flagged"], g["spam"])) for x in labels)
        flagged = " / ".join(f(_share(segments[x][seg]["legit_flagged"], g["legit"])) for x in labels)
        lines.append(f"| {age} | {link} | {journey} | {g['spam']} | {caught} | {g['legit']} | {flagged} | {mark} |")
    return "\n".join(lines)


def _targets_lines(targets: dict) -> str:
    return "\n".join(f"- {name}: {'met' if t.get('met') else 'NOT met'} "
                     f"({', '.join(f'{k}={v}' for k, v in t.items() if k not in ('met', 'registers'))})"
                     for name, t in targets.items())


def register_table(target: dict, label: str = "engine") -> str:
    """`register_targets` as a table: per register, lures caught and legitimate posts flagged, text model alone ->
    engine; `worse` marks a register where the engine is below its text model."""
    f = _cell
    worse = set(target["engine_worse_than_text"])
    lines = ["per register (the data set a post's text came from), every scenario pooled: text model alone -> engine"
             f" (worse: beyond {target['slack']['posts']} posts and {target['slack']['share']:.0%})",
             f"{'register':<16}{'lures':>7}{'caught':>18}{'legit':>7}{'flagged':>18}"]
    for reg, row in target["registers"].items():
        spam, legit = row.get("spam", {}), row.get("legit", {})
        mark = " worse" if {f"{reg} spam", f"{reg} legit"} & worse else ""
        lines.append(f"{reg:<16}{spam.get('posts', 0):>7}{f(spam.get('text_only')) + ' -> ' + f(spam.get(label)):>18}"
                     f"{legit.get('posts', 0):>7}{f(legit.get('text_only')) + ' -> ' + f(legit.get(label)):>18}{mark}")
    return "\n".join(lines)


def format_report(report: dict) -> str:
    """The scenario table, the account-segment tables (lure scenarios, then every scenario) and the targets."""
    parts = [format_table(report)]
    labels = [x for x in ("text_only", "before", "engine") if x in report["overall"]]
    lures = [report["scenarios"][s] for s in LURE_SCENARIOS if s in report["scenarios"]]
    if lures:
        parts.append(segment_table(pooled_segments(lures), "link-less lures by people (" +
                                   ", ".join(s for s in LURE_SCENARIOS if s in report["scenarios"]) + "):"))
    parts.append(segment_table({x: report["overall"][x]["account_segments"] for x in labels}, "every scenario:"))
    if "registers_engine_vs_text_only" in report["targets"]:
        parts.append(register_table(report["targets"]["registers_engine_vs_text_only"]))
    parts.append("targets:\n" + _targets_lines(report["targets"]))
    if "before" in report:
        parts.append(f"targets of the earlier model {report['before']['decision_model']}:\n" +
                     _targets_lines(report["before"]["targets"]))
        parts.append(before_table(report["before"]["segments_vs_before"], report["before"]["decision_model"]))
    return "\n\n".join(parts)


def before_table(comparison: dict, before_version: str) -> str:
    """`segments_vs_before` as a table: per segment, spam caught and legitimate posts flagged, earlier model ->
    this one; `worse` marks a segment beyond the slack."""
    f = _cell
    worse = set(comparison["worse"])
    lines = [f"every segment against the earlier model {before_version} (same posts; worse = beyond "
             f"{comparison['slack']['posts']} posts and {comparison['slack']['share']:.0%}): "
             + ("none worse" if not worse else f"{len(worse)} worse"),
             "| segment | spam | caught: before -> engine | legit | flagged: before -> engine | |",
             "|---|---|---|---|---|---|"]
    for seg, v in comparison["segments"].items():
        caught = f"{f(_share(v['before_spam_flagged'], v['spam']))} -> {f(_share(v['spam_flagged'], v['spam']))}"
        flagged = f"{f(_share(v['before_legit_flagged'], v['legit']))} -> {f(_share(v['legit_flagged'], v['legit']))}"
        lines.append(f"| {seg} | {v['spam']} | {caught} | {v['legit']} | {flagged} | {'worse' if seg in worse else ''} |")
    return "\n".join(lines)


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
