"""`modpipe decision train --labels`: learn from moderators' labels, with the simulation as a prior.

Each label (the newest per post in `labels`) is joined with the decision it judges: the post's latest
decision published before the label, whose `features` are exactly what the decider saw. Those rows are
split by label time: the older `1 - eval_fraction` train, the newest are held out. The candidate trains on
the simulated traffic (replayed with the serving model's feedback, as `decision train` does) plus the
training labels, each label weighing `label_weight` simulated posts: with few labels the simulation
dominates, with many the platform's own judgement does. Candidate and serving model are then scored on
the held-out labels (spam = review or block, as moderators see it); the candidate is written (a new
versioned directory in the decision cache, not served until `decision promote`) only if its F1 there is
not lower, ties broken by log loss. The report says by how much, on how many labels.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from modpipe import log, schema
from modpipe.decision import dataset
from modpipe.decision.model import DECISION_FEATURES, DecisionModel
from modpipe.settings import Settings

_log = log.get(__name__)

LABEL_RUN = "labels"
MIN_LABELS = 20


class NotEnoughLabels(ValueError):
    """Too few labels joined with a decision to train and to judge a candidate."""


def newest_labels(labels: Iterable[dict]) -> dict[str, dict]:
    """post_id -> its newest label (a moderator's later label stands)."""
    newest: dict[str, dict] = {}
    for label in labels:
        seen = newest.get(label["post_id"])
        if seen is None or str(label["created_at"]) >= str(seen["created_at"]):
            newest[label["post_id"]] = label
    return newest


def label_rows(decisions: Iterable[dict], labels: Iterable[dict]) -> list[dataset.Row]:
    """One row per labelled post: its newest label, the features of its newest decision made before that
    label (else its newest decision). Posts without a decision are left out (nothing to learn from)."""
    newest = newest_labels(labels)
    by_post: dict[str, list[dict]] = {}
    for d in decisions:
        if d.get("post_id") in newest and isinstance(d.get("features"), dict):
            by_post.setdefault(d["post_id"], []).append(d)
    rows = []
    for post_id, label in newest.items():
        candidates = by_post.get(post_id)
        if not candidates:
            continue
        before = [d for d in candidates if str(d.get("decided_at")) <= str(label["created_at"])] or candidates
        d = max(before, key=lambda x: (x.get("revision") or 1, str(x.get("decided_at"))))
        rows.append(dataset.Row(post_id=post_id, run=LABEL_RUN, at_ms=schema.epoch_ms(label["created_at"]), features=d["features"],
                                truth={"is_spam": label["label"] == "spam", "moderator_id": label.get("moderator_id")}))
    rows.sort(key=lambda r: (r.at_ms, r.post_id))
    return rows


def _read_with_labels(settings: Settings, bootstrap: str, topic: str, decode) -> tuple[list[dict], list[dict]]:
    """(records of `topic` decoded, labels) as the broker holds them; what does not decode is skipped (the
    pipeline dead-lettered it; nothing to learn from)."""
    from modpipe.services.readback import read_to_end

    records, labels = [], []
    for msg in read_to_end(settings, bootstrap, [settings.topic(topic), settings.topic("labels")]):
        try:
            if msg.topic() == settings.topic("labels"):
                labels.append(schema.decode_label(msg.value()))
            else:
                records.append(decode(msg.value()))
        except (schema.InvalidMessage, ValueError):
            continue
    return records, labels


def read_label_rows(settings: Settings, bootstrap: str) -> list[dataset.Row]:
    """`label_rows` over everything the broker holds in `decisions` and `labels`."""
    import orjson

    return label_rows(*_read_with_labels(settings, bootstrap, "decisions", orjson.loads))


def labelled_texts(posts: Iterable[dict], labels: Iterable[dict]) -> list[dict]:
    """The moderators' texts for the text model: {text, label, post_id, moderator_id, labelled_at} per post
    with a label and a known text, its newest label standing; ordered by label time."""
    newest = newest_labels(labels)
    texts = {p["post_id"]: p["text"] for p in posts if p.get("post_id") in newest}
    out = [{"text": texts[pid], "label": label["label"], "post_id": pid, "moderator_id": label["moderator_id"],
            "labelled_at": label["created_at"]} for pid, label in newest.items() if pid in texts]
    out.sort(key=lambda r: (str(r["labelled_at"]), r["post_id"]))
    return out


def export_labelled_texts(settings: Settings, bootstrap: str, path: Path) -> int:
    """Write `labelled_texts` of everything the broker holds in `posts` and `labels` as JSONL; returns the
    number of lines: the input of `modpipe model build --extra-data`."""
    import orjson

    from modpipe import schema

    rows = labelled_texts(*_read_with_labels(settings, bootstrap, "posts",
                                             lambda value: schema.decode_post(value, settings.max_text_chars)))
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    tmp.replace(path)
    return len(rows)


def scores(model_decide, rows: Sequence[dataset.Row]) -> dict:
    """Spam F1 (review or block counts as spam), accuracy and log loss of a decider on labelled rows."""
    verdicts = model_decide([r.features for r in rows])
    y = np.asarray([r.spam for r in rows], dtype=bool)
    flagged = np.asarray([v.verdict != "allow" for v in verdicts], dtype=bool)
    p = np.clip(np.asarray([v.spam_probability for v in verdicts], dtype=np.float64), 1e-9, 1 - 1e-9)
    tp, fp, fn = int((flagged & y).sum()), int((flagged & ~y).sum()), int((~flagged & y).sum())
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    return {"f1": round(f1, 4), "accuracy": round(float((flagged == y).mean()), 4),
            "logloss": round(float(-np.mean(y * np.log(p) + (~y) * np.log(1 - p))), 5), "tp": tp, "fp": fp, "fn": fn}


def fit_with_labels(sim_rows: Sequence[dataset.Row], labelled: Sequence[dataset.Row], serving, *, label_weight: float,
                    eval_fraction: float, config, seed: int, review_threshold: float, block_threshold: float) -> tuple:
    """(candidate DecisionModel, report). Pure given its rows: no Kafka, no files."""
    from modpipe.decision.engine import DecisionEngine
    from modpipe.decision.train import choose_text_floor, fit, time_split

    usable = [r for r in labelled if r.features.get("text_probability") is not None]
    if len(usable) < MIN_LABELS:
        raise NotEnoughLabels(f"{len(usable)} labelled posts with a decision made with the text model; need at least "
                              f"{MIN_LABELS} to train and to judge a candidate")
    cut = int(len(usable) * (1 - eval_fraction))
    train_labels, held_out = list(usable[:cut]), list(usable[cut:])
    sim_train, sim_valid = time_split(list(sim_rows), config.train_fraction)
    booster, report = fit(sim_train + train_labels, sim_valid, config, seed,
                          weight=lambda r: label_weight if r.run == LABEL_RUN else 1.0)
    candidate = DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster))
    floor, floors = choose_text_floor(candidate, sim_valid, config, review_threshold, block_threshold)
    engine = DecisionEngine(candidate, review_threshold, block_threshold, text_floor=floor)
    serving_scores, candidate_scores = scores(serving.decide_many, held_out), scores(engine.decide_many, held_out)
    better = (candidate_scores["f1"], -candidate_scores["logloss"]) >= (serving_scores["f1"], -serving_scores["logloss"])
    return candidate, {
        "labels": len(usable), "train_labels": len(train_labels), "held_out_labels": len(held_out),
        "held_out_spam": int(sum(r.spam for r in held_out)), "simulated_rows": len(sim_rows),
        "label_weight": label_weight, "fit": report, "text_floor": {"chosen": floor, "candidates": floors}, "serving": {"version": serving.version, **serving_scores},
        "candidate": {"version": candidate.version, **candidate_scores},
        "f1_change": round(candidate_scores["f1"] - serving_scores["f1"], 4),
        "logloss_change": round(candidate_scores["logloss"] - serving_scores["logloss"], 5),
        "not_worse": bool(better)}


def train_on_labels(settings: Settings, build, *, bootstrap: str, profile: str = "full", seed: int = 0,
                    label_weight: float = 10.0, eval_fraction: float = 0.25, force: bool = False,
                    progress: bool = True, rows: Sequence[dataset.Row] | None = None) -> dict:
    """Read the labels, train, judge, write the candidate if it is not worse; returns the report."""
    from modpipe.decision.store import decision_root, load_engine
    from modpipe.decision.train import PROFILES, simulated_rows

    started = time.monotonic()
    labelled = list(rows) if rows is not None else read_label_rows(settings, bootstrap)
    serving = load_engine(settings, build.version)
    config = PROFILES[profile]
    sim = simulated_rows(settings, build, config, seed, serving, progress=progress)
    candidate, report = fit_with_labels(sim, labelled, serving, label_weight=label_weight,
                                        eval_fraction=eval_fraction, config=config, seed=seed,
                                        review_threshold=settings.review_threshold,
                                        block_threshold=settings.block_threshold)
    report["seconds"] = round(time.monotonic() - started, 1)
    report["written"] = None
    if report["not_worse"] or force:
        candidate.meta = {"policy": {"text_floor": report["text_floor"]["chosen"]},
                          "text_model_version": build.version, "trained_on": "labels+simulation", "profile": profile,
                          "seed": seed, "labels_report": {k: v for k, v in report.items() if k != "written"}}
        out = Path(decision_root(settings)) / f"labels-{candidate.version}"
        candidate.save(out)
        report["written"] = str(out)
        _log.info("decision model trained on labels", extra={"path": str(out), "f1_change": report["f1_change"]})
    else:
        _log.warning("the model trained on labels is worse than the serving one on the held-out labels: not written",
                     extra={"f1_change": report["f1_change"], "logloss_change": report["logloss_change"]})
    return report
