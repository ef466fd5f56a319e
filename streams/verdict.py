"""From scores to a verdict. The seam where the decision model plugs in.

A `Decider` gets the post, its feature map and the text model's probability, and returns the
verdict with its reasons. `ThresholdDecider` maps the text probability through two thresholds;
the LightGBM decision engine replaces it without touching the agents.
"""

from __future__ import annotations

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

    def decide(self, post: dict, features: dict, text_probability: float | None) -> Verdict: ...


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

    def decide(self, post: dict, features: dict, text_probability: float | None) -> Verdict:
        p = float(text_probability or 0.0)
        reasons = [{"feature": "text_probability", "value": round(p, 6), "contribution": round(p, 6),
                    "description": f"the text classifier rates the text {p:.0%} likely spam"}]
        return Verdict(verdict_for(p, self.review_threshold, self.block_threshold), p, reasons)
