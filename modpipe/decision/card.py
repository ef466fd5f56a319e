"""MODEL_CARD.md of a decision model: what it decides from, what it learned, the licences that bind it."""

from __future__ import annotations

from collections import Counter

LIGHTGBM_LICENCE = "MIT"


def render(*, version: str, meta: dict, features: list[str], text_model_version: str, texts: list[dict]) -> str:
    """The card, from the model's metadata and the texts its simulated traffic was made of."""
    by_set = Counter((t.get("dataset") or "unknown", t.get("label")) for t in texts)
    rows = "\n".join(f"| {name} | {label} | {n:,} |" for (name, label), n in sorted(by_set.items()))
    last = (meta.get("rounds") or [{}])[-1]
    gain = sorted((meta.get("importance_gain") or {}).items(), key=lambda kv: -kv[1])[:10]
    return f"""# Decision model {version}

LightGBM ({LIGHTGBM_LICENCE}) binary classifier: a post's spam probability from {len(features)} features (the user,
the link, the message, the text model's probability), behind the bans' short-circuit
(`modpipe.decision.engine`). Profile `{meta.get('profile')}`, seed {meta.get('seed')}, cache key `{meta.get('key')}`,
trained in {meta.get('train_seconds')} s.

## What it learned from, and the licences that bind it
Simulated platform traffic (`modpipe.simulation`, seeded; ground truth from the simulation) whose post texts are
the held-out texts of text model `{text_model_version}`, replayed through the same feature code the workers run,
with that text model's probabilities. No text is stored in the model: its trees hold thresholds on features.
The texts' sources and licences are those of the text model's build (its `MODEL_CARD.md`, "Sources and
licenses"); the texts used here, by data set:

| data set | label | texts |
|---|---|---|
{rows}

## Result of training
Last round: {", ".join(f"{k} {v}" for k, v in last.items() if not isinstance(v, (dict, list)))}.
Text floor (policy): {meta.get('policy', {}).get('text_floor')}.

Largest gains: {", ".join(f"`{name}` {value:.3g}" for name, value in gain)}.

## Features
{", ".join(f"`{f}`" for f in features)}
"""
