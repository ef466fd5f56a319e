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
    kinds, durations, invalid = [], [], 0
    for item in journey:
        if not isinstance(item, dict):
            invalid += 1
            continue
        ms = _ms(item.get("ms"))
        if ms is None:
            invalid += 1
        else:
            durations.append(ms)
        kinds.append((_kind(item.get("step")), ms))
    first_submit = next((i for i, (k, _) in enumerate(kinds) if k == "submit"), len(kinds))
    before = kinds[:first_submit]
    typed = any(k in ("type", "paste") for k, _ in before)
    pasted = any(k == "paste" for k, _ in before)
    typing_ms = sum(ms for k, ms in before if k == "type" and ms is not None)
    has_typing = any(k == "type" for k, _ in before)
    cps = None
    if has_typing and text_length is not None:
        cps = float("inf") if typing_ms == 0 else text_length * 1000.0 / typing_ms
    too_fast = False
    if has_typing and not pasted:
        too_fast = cps > MAX_HUMAN_CPS if cps is not None else typing_ms < MIN_TYPING_MS
    return {
        "journey_steps": len(journey),
        "journey_total_ms": sum(durations),
        "journey_min_step_ms": min(durations) if durations else None,
        "journey_max_step_ms": max(durations) if durations else None,
        "journey_typing_ms": typing_ms,
        "journey_typing_cps": None if cps is None or cps == float("inf") else round(cps, 3),
        "journey_paste": pasted,
        "journey_has_submit": first_submit < len(kinds),
        "journey_invalid_steps": invalid,
        "journey_submit_without_typing": (not typed) or too_fast,
    }
