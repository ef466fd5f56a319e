"""From scores to a verdict. The seam where the decision model plugs in.

A `Decider` gets feature maps (each including the text model's `text_probability`) and returns one
verdict per map, with its reasons. `modpipe.decision.engine.DecisionEngine` (LightGBM over every
signal) is the production decider; `ThresholdDecider` maps the text probability alone through the
two thresholds: the text-only baseline of `modpipe decision eval`, and `MODPIPE_DECIDER=text-only`.
Shortcuts (bans) are applied before any decider by `modpipe.decision.engine.cascade`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class Verdict:
    verdict: str
    spam_probability: float
    reasons: list[dict] = field(default_factory=list)
    short_circuit: str | None = None


class Decider(Protocol):
    version: str

    def decide_many(self, features_list: Sequence[dict]) -> list[Verdict]: ...


TEXT_MODEL_UNAVAILABLE = {
    "feature": "text_probability", "value": None, "contribution": None,
    "description": "the text model did not answer (an outage): decided without it, and decided again once it answers"}


def without_text_model(verdict: Verdict, policy: str) -> Verdict:
    """A verdict made while the text model is out. `decide`: the decision model's verdict from the other
    signals, with the outage as its first reason; `review`: every such post goes to the review band."""
    reasons = [TEXT_MODEL_UNAVAILABLE, *verdict.reasons]
    if policy == "review":
        return Verdict("review", verdict.spam_probability, reasons, verdict.short_circuit)
    if policy == "decide":
        return Verdict(verdict.verdict, verdict.spam_probability, reasons, verdict.short_circuit)
    raise ValueError(f"no verdict without the text model under policy {policy!r}")


def verdict_for(probability: float, review_threshold: float, block_threshold: float) -> str:
    if probability >= block_threshold:
        return "block"
    if probability >= review_threshold:
        return "review"
    return "allow"


@dataclass(frozen=True)
class ThresholdDecider:
    """spam_probability = the text model's probability; the only reason is that probability."""

    review_threshold: float = 0.5
    block_threshold: float = 0.9
    version: str = "thresholds-v1"

    def decide_many(self, features_list: Sequence[dict]) -> list[Verdict]:
        out = []
        for features in features_list:
            p = float(features.get("text_probability") or 0.0)
            reasons = [{"feature": "text_probability", "value": round(p, 6), "contribution": round(p, 6),
                        "direction": "spam" if p >= 0.5 else "ham",
                        "description": f"the text classifier rates the text {p:.0%} likely spam"}]
            out.append(Verdict(verdict_for(p, self.review_threshold, self.block_threshold), p, reasons))
        return out
