"""The decision engine: a cascade of shortcuts, then one LightGBM model over every signal.

1. Shortcuts (`cascade`): a banned link domain or poster IP decides `block` at once; the text model is
   not asked (`shortcut` is checked before the batching agent builds its Triton request).
2. LightGBM: spam_probability from the text model's probability and every numeric feature; two
   thresholds map it to allow / review / block.
3. Text floor: a post the text model rates at or above `text_floor` goes at least to review, whatever
   the other signals say, so the engine never knows less than its own text model (a lure posted by a
   person from an ordinary account looks clean in every other signal). One exception (`at_home`): an
   author posting again from an address that only it has used keeps the model's verdict; a taken-over
   account's lure comes from an address new to the account, and the text model's false positives on
   people's own writing mostly come from home (measured in docs/decision-engine.md: the exception halves
   the floor's false positives and keeps every lure it catches). The floor is chosen at training time
   against the review load (`modpipe.decision.train.choose_text_floor`) and kept in the model's
   `model.json` (`policy.text_floor`); MODPIPE_TEXT_FLOOR overrides it.
4. Reasons: the `top_reasons` features with the largest per-prediction contributions (TreeSHAP, in
   log-odds), largest first, each with its value and a sentence for the moderator; when the floor raised
   the verdict, the text comes first and says so. TreeSHAP costs ~30x a plain prediction (~90 against ~3 us a
   post at batches of 64): with `reasons_for="flagged"` (MODPIPE_REASONS) an `allow` verdict carries none and
   only the posts that end in review or block, or whose score lies within `NEAR` of a threshold, are
   explained; their probability is then the contributions' sum exactly as with `all`.

Plain class, no Kafka: the batching agent, the re-decision hook and `modpipe decision train|eval` call
the same `decide_many`, so offline evaluation measures exactly what the worker does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from modpipe.decision.model import DECISION_FEATURES, DecisionModel, decision_matrix
from modpipe.decision.reasons import describe
from modpipe.decision.verdict import Decider, Verdict, verdict_for

REASONS_FOR = ("all", "flagged")
# A score this close to a threshold is taken from the contributions' sum (as with reasons for all), so that the
# raw score's different summation order (~1e-15) cannot move a verdict across it.
NEAR = 1e-9

# (feature, short_circuit code): checked in this order; the first true one decides.
SHORTCUTS = (("domain_banned", "domain_banned"), ("ip_banned", "ip_banned"))


def shortcut(features: dict) -> str | None:
    """The short-circuit code when a ban decides the post, else None."""
    for feature, code in SHORTCUTS:
        if features.get(feature) is True:
            return code
    return None


def shortcut_verdict(code: str, features: dict) -> Verdict:
    feature = next(f for f, c in SHORTCUTS if c == code)
    reason = {"feature": feature, "value": True, "contribution": None, "description": describe(feature, True)}
    return Verdict("block", 1.0, [reason], short_circuit=code)


def cascade(decider: Decider, features_list: Sequence[dict]) -> list[Verdict]:
    """Shortcuts first; the decider sees only the posts no shortcut decided (in one call)."""
    out: list[Verdict | None] = [None] * len(features_list)
    pending = []
    for i, features in enumerate(features_list):
        code = shortcut(features)
        if code is None:
            pending.append(i)
        else:
            out[i] = shortcut_verdict(code, features)
    if pending:
        for i, verdict in zip(pending, decider.decide_many([features_list[i] for i in pending]), strict=True):
            out[i] = verdict
    return out  # type: ignore[return-value]


def text_floor_reason(text_probability: float, floor: float) -> dict:
    return {"feature": "text_probability", "value": round(text_probability, 6), "contribution": None,
            "direction": "spam",
            "description": f"the text classifier rates the text {text_probability:.0%} likely spam, at or above the "
                           f"text floor ({floor:g}): a moderator looks at it whatever the other signals say"}


def at_home(features: dict) -> bool:
    """The author posted from this address before (the count includes this post) and no other account did."""
    users, posts = features.get("ip_distinct_users"), features.get("ip_posts")
    return users == 1 and isinstance(posts, int | float) and posts >= 2


def model_text_floor(model: DecisionModel) -> float | None:
    """The floor the model was trained with (model.json `policy.text_floor`), None for none."""
    floor = (model.meta.get("policy") or {}).get("text_floor")
    return None if floor is None else float(floor)


@dataclass
class DecisionEngine:
    model: DecisionModel
    review_threshold: float = 0.5
    block_threshold: float = 0.9
    top_reasons: int = 5
    text_floor: float | None = None  # see the module docstring; None: no floor
    reasons_for: str = "all"  # REASONS_FOR: which verdicts carry their reasons (the module docstring)

    @classmethod
    def for_model(cls, model: DecisionModel, review_threshold: float, block_threshold: float,
                  text_floor: str = "", reasons_for: str = "all") -> DecisionEngine:
        """`text_floor` as MODPIPE_TEXT_FLOOR gives it: empty = the model's own, `off`, or a probability."""
        floor = model_text_floor(model) if text_floor == "" else None if text_floor == "off" else float(text_floor)
        return cls(model, review_threshold, block_threshold, text_floor=floor, reasons_for=reasons_for)

    @property
    def version(self) -> str:
        return self.model.version

    def decide_many(self, features_list: Sequence[dict]) -> list[Verdict]:
        """One verdict per feature map (each map includes `text_probability`); one LightGBM call for all."""
        if not features_list:
            return []
        x = decision_matrix(list(features_list))
        if self.reasons_for == "flagged":
            return self._decide_flagged(features_list, x)
        contrib = self.model.contributions(x)
        # TreeSHAP contributions plus the bias sum to the raw score: the probability follows from them,
        # so the reasons explain exactly the number that was thresholded.
        probs = 1.0 / (1.0 + np.exp(-contrib.sum(axis=1)))
        return [self._verdict(features, float(p), c) for features, p, c in zip(features_list, probs, contrib, strict=True)]

    def _decide_flagged(self, features_list: Sequence[dict], x: np.ndarray) -> list[Verdict]:
        """A plain prediction for every row; contributions only for the rows explained (the module docstring)."""
        probs = self.model.predict(x)
        explain = [i for i, (features, p) in enumerate(zip(features_list, probs, strict=True))
                   if self._flagged(features, float(p))]
        out: list[Verdict] = [Verdict("allow", float(p), []) for p in probs]  # the explained ones replaced below
        if explain:
            contrib = self.model.contributions(x[explain])
            for i, p, c in zip(explain, 1.0 / (1.0 + np.exp(-contrib.sum(axis=1))), contrib, strict=True):
                out[i] = self._verdict(features_list[i], float(p), c)
        return out

    def _flagged(self, features: dict, p: float) -> bool:
        """Whether the post ends in review or block (the floor included), or lies within NEAR of a threshold."""
        if p >= min(self.review_threshold, self.block_threshold) - NEAR:
            return True
        text_p = features.get("text_probability")
        return self.text_floor is not None and isinstance(text_p, float | int) and text_p >= self.text_floor \
            and not at_home(features)

    def _verdict(self, features: dict, p: float, contributions: np.ndarray | None) -> Verdict:
        """`contributions` None: a verdict without reasons (`reasons_for="flagged"`, an allow)."""
        verdict = verdict_for(p, self.review_threshold, self.block_threshold)
        reasons = [] if contributions is None else self.reasons(features, contributions)
        text_p = features.get("text_probability")
        if verdict == "allow" and self.text_floor is not None and isinstance(text_p, float | int) \
                and text_p >= self.text_floor and not at_home(features):
            # the score is raised to the review threshold, so that a consumer thresholding spam_probability
            # reads the same verdict; the reasons say the floor decided, the model's own score was lower
            verdict, p = "review", max(p, self.review_threshold)
            reasons = [text_floor_reason(float(text_p), self.text_floor),
                       *[r for r in reasons if r["feature"] != "text_probability"]][: self.top_reasons]
        return Verdict(verdict, p, reasons)

    def reasons(self, features: dict, contributions: np.ndarray) -> list[dict]:
        order = np.argsort(-np.abs(contributions[:-1]), kind="stable")[: self.top_reasons]
        reasons = []
        for j in order:
            c = float(contributions[j])
            if abs(c) < 5e-5:  # rounds to 0: no reason at all
                break
            name = DECISION_FEATURES[j]
            value = features.get(name)
            reasons.append({"feature": name, "value": value, "contribution": round(c, 4),
                            "direction": "spam" if c > 0 else "ham", "description": describe(name, value)})
        return reasons
