"""Features of the UI journey before a post: a list of {"step": str, "ms": int}.

`ms` is read as the time spent in that step (its duration). Bots post through the API (no journey, or a
bare submit) or replay scripted steps far faster than a person can type.
"""

from __future__ import annotations

from typing import Any

from modpipe import memory

TYPING_STEPS = frozenset({"type", "typing", "keypress", "keydown", "keyup", "input", "compose", "edit", "write"})
PASTE_STEPS = frozenset({"paste"})
SUBMIT_STEPS = frozenset({"submit", "post", "send", "publish"})
MAX_HUMAN_CPS = 20.0  # ~240 words/minute: faster sustained typing is not a person (records are ~216 wpm)
MIN_TYPING_MS = 150  # a typing step shorter than this, text length unknown, is a scripted fill

JOURNEY_FEATURES = (
    "journey_steps", "journey_total_ms", "journey_min_step_ms", "journey_max_step_ms", "journey_typing_ms",
    "journey_typing_cps", "journey_paste", "journey_has_submit", "journey_invalid_steps",
    "journey_submit_without_typing",
)


def _kind(step: Any) -> str:
    return _kind_of(step if isinstance(step, str) else str(step or ""))


@memory.cached("journey_step")  # a platform's journeys use a handful of step names; by bytes: any length
def _kind_of(step: str) -> str:
    name = step.strip().lower().replace("-", "_")
    base = name.split(":", 1)[0].split("_", 1)[0]  # `type:title`, `type_body` -> `type`
    if name in TYPING_STEPS or base in TYPING_STEPS:
        return "type"
    if name in PASTE_STEPS or base in PASTE_STEPS:
        return "paste"
    if name in SUBMIT_STEPS or base in SUBMIT_STEPS:
        return "submit"
    return "other"


def _ms(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value or value < 0:
        return None
    return int(value) if value < 1e12 else None  # > 30 years in one step: garbage


def journey_features(journey: Any, text_length: int | None = None) -> dict[str, Any]:
    """All JOURNEY_FEATURES; every value None when the post carries no journey list.

    `journey_submit_without_typing` is True when the (first) submit - or the end of the journey when no
    submit step was recorded, the post did get submitted - has no typing/paste step before it, or when
    the text was typed faster than MAX_HUMAN_CPS (needs `text_length`; without it a typing step shorter
    than MIN_TYPING_MS counts), with no paste to explain it. An empty journey is True: nothing was typed.
    """
    if not isinstance(journey, list):
        return dict.fromkeys(JOURNEY_FEATURES)
    # one pass (this runs for every post): durations over every step, kinds only up to the first submit
    total, low, high, invalid = 0, None, None, 0
    submitted = has_typing = pasted = False
    typing_ms = 0
    for item in journey:
        if not isinstance(item, dict):
            invalid += 1
            continue
        ms = _ms(item.get("ms"))
        if ms is None:
            invalid += 1
        else:
            total += ms
            if low is None or ms < low:
                low = ms
            if high is None or ms > high:
                high = ms
        if submitted:
            continue
        kind = _kind(item.get("step"))
        if kind == "submit":
            submitted = True
        elif kind == "type":
            has_typing = True
            if ms is not None:
                typing_ms += ms
        elif kind == "paste":
            pasted = True
    typed = has_typing or pasted
    cps = None
    if has_typing and text_length is not None:
        cps = float("inf") if typing_ms == 0 else text_length * 1000.0 / typing_ms
    too_fast = False
    if has_typing and not pasted:
        too_fast = cps > MAX_HUMAN_CPS if cps is not None else typing_ms < MIN_TYPING_MS
    return {
        "journey_steps": len(journey),
        "journey_total_ms": total,
        "journey_min_step_ms": low,
        "journey_max_step_ms": high,
        "journey_typing_ms": typing_ms,
        "journey_typing_cps": None if cps is None or cps == float("inf") else round(cps, 3),
        "journey_paste": pasted,
        "journey_has_submit": submitted,
        "journey_invalid_steps": invalid,
        "journey_submit_without_typing": (not typed) or too_fast,
    }
