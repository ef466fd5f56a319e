"""The decision model on disk: a LightGBM booster, the feature list it was trained on, and its version.

A build directory holds `model.txt` (LightGBM's text format, which Triton's FIL backend also reads) and
`model.json` (feature list, version, training report). `DecisionModel.load` refuses a model whose
feature list differs from the one this code assembles: a tree split on column 17 means nothing if
column 17 is now another feature, and such a model would decide silently wrong.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modpipe.features.vector import NUMERIC_FEATURES, to_matrix, to_vector

# Column order of the model's input: the text model's probability, then every numeric feature.
DECISION_FEATURES: tuple[str, ...] = ("text_probability",) + NUMERIC_FEATURES
MODEL_FILE, META_FILE = "model.txt", "model.json"


class FeatureListMismatch(ValueError):
    """The model was trained on other features (or another order) than this code produces."""


class DecisionModelMissing(FileNotFoundError):
    """No decision model where one was expected."""


def decision_vector(features: dict[str, Any]) -> list[float]:
    """DECISION_FEATURES as floats: True/False -> 1/0, None or non-numeric -> NaN (LightGBM's missing)."""
    return to_vector(features, DECISION_FEATURES)


def decision_matrix(features_list: list[dict[str, Any]]) -> np.ndarray:
    """`decision_vector` of each map, as the rows of one array (one conversion for a batch)."""
    return to_matrix(features_list, DECISION_FEATURES)


def check_feature_list(found: list[str], source: str) -> None:
    expected = list(DECISION_FEATURES)
    if found == expected:
        return
    missing = [f for f in expected if f not in found]
    extra = [f for f in found if f not in expected]
    detail = []
    if missing:
        detail.append(f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if extra:
        detail.append(f"unknown {extra[:8]}{' ...' if len(extra) > 8 else ''}")
    if not missing and not extra:
        first = next(i for i, (a, b) in enumerate(zip(found, expected, strict=True)) if a != b)
        detail.append(f"same features in another order (column {first}: {found[first]!r}, expected {expected[first]!r})")
    raise FeatureListMismatch(
        f"decision model {source} was trained on {len(found)} features, this code produces {len(expected)}: "
        f"{'; '.join(detail)}. Retrain it with `modpipe decision train`.")


@dataclass
class DecisionModel:
    booster: Any  # lightgbm.Booster
    features: list[str]
    version: str
    meta: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | str) -> DecisionModel:
        import lightgbm as lgb

        path = Path(path)
        if not (path / MODEL_FILE).is_file() or not (path / META_FILE).is_file():
            raise DecisionModelMissing(
                f"no decision model in {path} (needs {MODEL_FILE} and {META_FILE}); build one with "
                "`modpipe decision train`")
        meta = json.loads((path / META_FILE).read_text())
        check_feature_list(list(meta.get("features", [])), str(path / META_FILE))
        booster = lgb.Booster(model_file=str(path / MODEL_FILE))
        check_feature_list(list(booster.feature_name()), str(path / MODEL_FILE))
        return cls(booster, list(meta["features"]), meta["version"], meta)

    def save(self, path: Path | str) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / MODEL_FILE).write_text(self.booster.model_to_string())
        (path / META_FILE).write_text(json.dumps({**self.meta, "features": self.features, "version": self.version},
                                                 indent=2, sort_keys=True))
        return path

    @staticmethod
    def version_of(booster) -> str:
        return "lgbm-" + hashlib.sha256(booster.model_to_string().encode()).hexdigest()[:12]

    def predict(self, rows: np.ndarray) -> np.ndarray:
        """Spam probability per row."""
        return self.booster.predict(np.asarray(rows, dtype=np.float64), num_threads=1)

    def contributions(self, rows: np.ndarray) -> np.ndarray:
        """Per-row, per-feature contributions in log-odds (TreeSHAP); the last column is the bias."""
        return self.booster.predict(np.asarray(rows, dtype=np.float64), pred_contrib=True, num_threads=1)
