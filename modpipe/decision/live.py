"""The decision model a running worker serves: reloaded when its pointer moves, and a shadow beside it.

A promotion moves a pointer (the `for-<text model>` or `current` link under the decision cache, written
atomically by `modpipe decision promote`, or whatever MODPIPE_DECISION_MODEL names). `WatchedDecider`
looks at the pointer at most every MODPIPE_DECISION_MODEL_WATCH_S seconds (one stat) and, when it resolves
to another directory or its model.json changed, loads the new model and swaps it in between two batches:
no restart, no lost post. A model that does not load (wrong feature list, half-copied files) is refused and
the serving one stays; both outcomes are counted (`modpipe_decision_model_reloads_total{result}`).

`ShadowScorer` scores the same feature maps with a candidate model (MODPIPE_SHADOW_DECISION_MODEL) after the
serving one decided: the serving verdict is the one published, always. Disagreements are counted by pair
of verdicts and logged with the post id, so a candidate can be judged on live traffic before promotion.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from prometheus_client import Counter

from modpipe import log
from modpipe.decision.verdict import Decider, Verdict

_log = log.get(__name__)

RELOADS = Counter("modpipe_decision_model_reloads_total",
                  "Promotions of the decision model seen by this worker, by result (loaded, refused).", ["result"])
SHADOW_DECISIONS = Counter("modpipe_shadow_decisions_total", "Posts also scored by the shadow decision model.")
SHADOW_DISAGREEMENTS = Counter("modpipe_shadow_disagreements_total",
                               "Posts where the shadow decision model's verdict differs from the served one.",
                               ["serving", "shadow"])


def pointer_fingerprint(pointer: Path) -> tuple[str, int] | None:
    """Where the pointer leads and when that model's metadata last changed; None when it leads nowhere."""
    try:
        target = Path(os.path.realpath(pointer))
        return str(target), (target / "model.json").stat().st_mtime_ns
    except OSError:
        return None


class WatchedDecider:
    """A Decider whose model follows a pointer (see the module docstring)."""

    def __init__(self, load: Callable[[Path], Decider], pointer: Callable[[], Path], check_every_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self._load, self._pointer, self.check_every_s, self._clock = load, pointer, check_every_s, clock
        path = pointer()
        self.current = load(path)
        self._seen = pointer_fingerprint(path)
        self._checked = clock()
        self._lock = threading.Lock()

    @property
    def version(self) -> str:
        return self.current.version

    def decide_many(self, features_list: Sequence[dict]) -> list[Verdict]:
        self.maybe_reload()
        return self.current.decide_many(features_list)

    def maybe_reload(self) -> bool:
        """Swap in the model the pointer now leads to, if it moved; True when a new model was loaded."""
        if self.check_every_s <= 0 or self._clock() - self._checked < self.check_every_s:
            return False
        with self._lock:
            self._checked = self._clock()
            path = self._pointer()
            seen = pointer_fingerprint(path)
            if seen is None or seen == self._seen:
                return False
            self._seen = seen
            before = self.current.version
            try:
                model = self._load(path)
            except Exception as exc:  # noqa: BLE001 - a bad promotion must not stop deciding
                RELOADS.labels("refused").inc()
                _log.error("promoted decision model refused; the serving one stays",
                           extra={"path": seen[0], "error": str(exc)[:500], "serving": before})
                return False
            self.current = model
            RELOADS.labels("loaded").inc()
            _log.warning("decision model promoted: now serving it", extra={"path": seen[0], "version": model.version,
                                                                          "previous": before})
            return True


class ShadowScorer:
    """Scores what the serving decider scored with a candidate, for comparison only."""

    def __init__(self, shadow: Decider):
        self.shadow = shadow

    @property
    def version(self) -> str:
        return self.shadow.version

    def observe(self, features_list: Sequence[dict], served: Sequence[Verdict], post_ids: Sequence[str]) -> int:
        """Count and log where the shadow disagrees; returns the disagreements. Never raises."""
        from modpipe.decision.engine import cascade

        try:
            shadow = cascade(self.shadow, features_list)
        except Exception as exc:  # noqa: BLE001 - the shadow may be broken; the serving path must not care
            _log.error("shadow decision model failed", extra={"error": str(exc)[:300], "shadow": self.version})
            return 0
        SHADOW_DECISIONS.inc(len(served))
        disagreements = 0
        for post_id, mine, theirs in zip(post_ids, served, shadow, strict=True):
            if mine.verdict != theirs.verdict:
                disagreements += 1
                SHADOW_DISAGREEMENTS.labels(mine.verdict, theirs.verdict).inc()
                _log.info("shadow decision model disagrees", extra={
                    "post_id": post_id, "serving": mine.verdict, "shadow": theirs.verdict,
                    "serving_p": round(mine.spam_probability, 4), "shadow_p": round(theirs.spam_probability, 4),
                    "shadow_version": self.version})
        return disagreements
