"""Where decision models live on disk and which one serves: what the worker needs to load a model,
without the training code (simulation, offline features, progress bars) that writes them."""

from __future__ import annotations

from pathlib import Path

from modpipe.settings import Settings


def decision_root(settings: Settings) -> Path:
    return settings.cache_dir / "decision"


def resolve_decision_model(settings: Settings, text_model_version: str | None = None) -> Path:
    """MODPIPE_DECISION_MODEL if set, else the model trained on the served text model, else the newest one.

    A decision model learned how the text model's probabilities relate to spam: one trained on another
    text model still loads (the feature list is the same) but its calibration is off, so prefer a match."""
    if settings.decision_model:
        return Path(settings.decision_model).expanduser()
    root = decision_root(settings)
    if text_model_version and (root / f"for-{text_model_version}" / "model.json").exists():
        return root / f"for-{text_model_version}"
    return root / "current"


def load_engine(settings: Settings, text_model_version: str, path: Path | None = None):
    from modpipe.decision.engine import DecisionEngine
    from modpipe.decision.model import DecisionModel

    model = DecisionModel.load(path or resolve_decision_model(settings, text_model_version))
    return DecisionEngine.for_model(model, settings.review_threshold, settings.block_threshold, settings.text_floor,
                                    settings.reasons)
