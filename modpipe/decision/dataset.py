"""Labelled decision data: load-generator traffic replayed through the very feature code the workers run.

`replay(events, text_probabilities, feedback)` feeds a simulation's events, in event-time order, to
`modpipe.features.offline.compute` (modpipe.features.events + modpipe.features.state + modpipe.features.vector: the functions the
stream workers' stages call, with dicts as storage) and records each post's feature map as of its decision,
with the ground truth the load generator attached. The pipeline feeds its own `block` verdicts back
into the tables (user_spam_posts, ip_spam_posts); the replay does the same through `feedback`, so a
model trained here sees the counts the worker will show it.

Texts: the text model's held-out (test-split) texts are split by a hash of the text into a training
half and an evaluation half, so `modpipe decision eval` scores traffic whose texts the decision model
never saw. Texts of registers whose licence allows evaluation only (phishing e-mail, airline tweets:
`platforms.EVAL_ONLY`) are never in the training half: no model learns from them, the decision model included. Text probabilities come from the served ONNX file run in process (the same file Triton
runs), cached per text-model version.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from modpipe import log
from modpipe.decision.engine import shortcut
from modpipe.features.offline import compute
from modpipe.simulation.simulator import Event, Simulation
from modpipe.textmodel.artifacts import ModelBuild
from modpipe.textmodel.platforms import EVAL_ONLY

_log = log.get(__name__)


def text_digest(text: str, size: int) -> bytes:
    """A stable hash of a text (any str, lone surrogates included) of `size` bytes."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=size).digest()


def text_half(text: str) -> str:
    """`train` or `eval`: a stable hash split of held-out texts."""
    return "train" if text_digest(text, 4)[0] % 2 == 0 else "eval"


def heldout_half(rows: Iterable[dict], half: str) -> list[dict]:
    """The half's rows in the order of their texts' hashes, not the build's: two text builds that hold the same
    held-out texts in another order give the same traffic, so their decision evaluations compare. The `train`
    half holds no text of an evaluation-only register (EVAL_ONLY)."""
    rows = [r for r in rows if isinstance(r.get("text"), str) and text_half(r["text"]) == half
            and not (half == "train" and r.get("dataset") in EVAL_ONLY)]
    return sorted(rows, key=lambda r: text_digest(r["text"], 64))


def simulate(texts: list[dict], scenario: str, seed: int, n_posts: int, rate: float) -> list[Event]:
    """A load-generator run (same simulation as `modpipe loadgen`) as an event list, side events included."""
    sim = Simulation(texts, scenario, seed, run_id=f"{scenario}-{seed}")
    return list(sim.events(i / rate for i in range(n_posts)))


class TextProbabilities:
    """text -> the served model's spam probability, computed in process and cached on disk per model version."""

    def __init__(self, build: ModelBuild, cache_dir: Path, threads: int = 2, progress: bool = True):
        self.build = build
        self.threads = threads
        self.progress = progress
        self.path = Path(cache_dir) / f"text-probabilities.{build.version}.json"
        self.cache: dict[str, float] = json.loads(self.path.read_text()) if self.path.exists() else {}

    @staticmethod
    def _key(text: str) -> str:
        return text_digest(text, 12).hex()

    def ensure(self, texts: Iterable[str]) -> None:
        from modpipe.textmodel.evaluate import served_spam_proba

        missing = sorted({t for t in texts if self._key(t) not in self.cache})
        if not missing:
            return
        _log.info("scoring texts with the text model in process", extra={"texts": len(missing)})
        probs = served_spam_proba(self.build, missing, threads=self.threads, desc="text model", progress=self.progress)
        self.cache.update({self._key(t): round(float(p), 6) for t, p in zip(missing, probs, strict=True)})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.cache))
        tmp.replace(self.path)

    def __getitem__(self, text: str) -> float:
        return self.cache[self._key(text)]


@dataclass
class Row:
    """One post as the decider saw it."""
    post_id: str
    run: str
    at_ms: int
    features: dict  # the decision record's features map, text_probability included
    truth: dict  # the load generator's ground truth (never in the payload)

    @property
    def spam(self) -> bool:
        return bool(self.truth["is_spam"])


# feedback(features) -> was the post blocked? (the verdict the pipeline feeds back to its tables)
Feedback = Callable[[dict], bool]


def replay(events: Sequence[Event], text_p: Mapping[str, float] | TextProbabilities, feedback: Feedback,
           run: str = "") -> list[Row]:
    truth = {e.payload["post_id"]: e.truth for e in events if e.kind == "post"}
    rows: list[Row] = []

    def decide(post: dict, features: dict) -> bool:
        # As the batching agent: a shortcut post is never sent to the text model.
        p = None if shortcut(features) is not None else text_p[post.get("text") or ""]
        full = {**features, "text_probability": p}
        rows.append(Row(post["post_id"], run, 0, full, truth[post["post_id"]]))
        return feedback(full)

    compute(((e.kind, e.payload) for e in events), decide=decide)
    at = {e.payload["post_id"]: e.at_ms for e in events if e.kind == "post"}
    for row in rows:
        row.at_ms = at[row.post_id]
    return rows


def post_texts(events: Iterable[Event]) -> list[str]:
    return [e.payload.get("text") or "" for e in events if e.kind == "post"]


def finite(x: float | None) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))
