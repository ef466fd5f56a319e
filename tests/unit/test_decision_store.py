"""Which decision model serves: MODPIPE_DECISION_MODEL, else the one trained for the served text model,
else the newest (`current`)."""

from __future__ import annotations

from modpipe.decision.store import decision_root, resolve_decision_model
from modpipe.settings import Settings


def test_the_named_model_wins(tmp_path):
    s = Settings.from_env({"MODPIPE_CACHE_DIR": str(tmp_path), "MODPIPE_DECISION_MODEL": "~/models/x"})
    assert str(resolve_decision_model(s, "v1")).endswith("models/x") and "~" not in str(resolve_decision_model(s))


def test_the_model_trained_for_the_served_text_model_else_current(tmp_path):
    s = Settings.from_env({"MODPIPE_CACHE_DIR": str(tmp_path)})
    root = decision_root(s)
    assert root == tmp_path / "decision"
    assert resolve_decision_model(s, "v1") == root / "current"  # nothing trained for v1
    (root / "for-v1").mkdir(parents=True)
    assert resolve_decision_model(s, "v1") == root / "current"  # a directory without a model does not count
    (root / "for-v1" / "model.json").write_text("{}")
    assert resolve_decision_model(s, "v1") == root / "for-v1"
    assert resolve_decision_model(s, "v2") == root / "current"
    assert resolve_decision_model(s, None) == root / "current"
