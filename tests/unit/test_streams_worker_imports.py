"""What a production worker loads: importing `modpipe.streams.worker` and building its deciders (LightGBM engine and
shadow, as `build_worker` does) pulls in no load generator, simulation, training, command-line or progress-bar
code. Checked in a fresh interpreter, where `sys.modules` holds only what the worker needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightgbm as lgb
import numpy as np

from modpipe.decision.model import DECISION_FEATURES, DecisionModel

ROOT = Path(__file__).resolve().parents[2]

FORBIDDEN_PACKAGES = ("modpipe.loadgen", "modpipe.simulation", "tqdm", "modpipe.console")
FORBIDDEN_MODULES = ("modpipe.decision.train", "modpipe.decision.dataset", "modpipe.decision.evaluate",
                     "modpipe.decision.labels", "modpipe.features.offline", "modpipe.textmodel.build",
                     "modpipe.textmodel.train")

PROBE = """
import json, sys
import modpipe.streams.worker as w
from modpipe.settings import Settings
settings = Settings.from_env()
decider = w.make_decider(settings, "text-model-v")
shadow = w.make_shadow(settings, "text-model-v")
[verdict] = decider.decide_many([{"text_probability": 0.9}])
print(json.dumps({"modules": sorted(sys.modules), "decider": decider.version, "shadow": shadow.version,
                  "verdict": verdict.verdict}))
"""


def forbidden(modules: list[str]) -> list[str]:
    return [m for m in modules
            if any(m == p or m.startswith(p + ".") for p in FORBIDDEN_PACKAGES) or m in FORBIDDEN_MODULES
            or m.endswith(".cli") or m.endswith(".__main__")]


def test_forbidden_names_what_the_worker_must_not_load():
    assert forbidden(["modpipe.streams.moderation.agents", "tqdm.auto", "modpipe.decision.cli", "modpipe.loadgen",
                      "modpipe.simulation.simulator", "modpipe.decision.train", "modpipe.decision.engine",
                      "modpipe.loadgenerator"]) == [
        "tqdm.auto", "modpipe.decision.cli", "modpipe.loadgen", "modpipe.simulation.simulator", "modpipe.decision.train"]


def test_a_worker_with_its_deciders_loads_no_loadgen_training_cli_or_tqdm(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.random((200, len(DECISION_FEATURES)))
    booster = lgb.train({"objective": "binary", "verbose": -1, "num_threads": 1, "min_data_in_leaf": 5},
                        lgb.Dataset(x, (x[:, 0] > 0.5).astype(float), feature_name=list(DECISION_FEATURES)),
                        num_boost_round=3)
    model = DecisionModel(booster, list(DECISION_FEATURES), DecisionModel.version_of(booster))
    path = model.save(tmp_path / "model")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MODPIPE_DECIDER": "lightgbm",
           "MODPIPE_DECISION_MODEL": str(path), "MODPIPE_SHADOW_DECISION_MODEL": str(path),
           "MODPIPE_CACHE_DIR": str(tmp_path / "cache"), "MODPIPE_STATE_DIR": str(tmp_path / "state")}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["decider"] == report["shadow"] == model.version  # the deciders really were built
    assert report["verdict"] in ("allow", "review", "block")
    assert "modpipe.streams.worker" in report["modules"] and "lightgbm" in report["modules"]
    assert not forbidden(report["modules"]), f"the worker loaded: {forbidden(report['modules'])}"


COMMAND_PROBE = """
import json, sys
from modpipe import cli
args = cli.build_parser(sys.argv[1:]).parse_args(sys.argv[1:])
print(json.dumps({"modules": sorted(sys.modules), "handler": args.func.__module__ + "." + args.func.__name__}))
"""


def _command_modules(argv: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", COMMAND_PROBE, *argv], env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_modpipe_worker_parses_its_command_line_without_the_other_commands_modules():
    report = _command_modules(["worker", "--name", "w0"])
    assert report["handler"].startswith("modpipe.streams.cli.")
    loaded = [m for m in forbidden(report["modules"]) if m not in ("modpipe.cli", "modpipe.streams.cli")]
    assert not loaded, f"`modpipe worker` loaded: {loaded}"
    everything = _command_modules(["config"])  # any other command builds every command's parser
    assert "modpipe.loadgen.cli" in everything["modules"] and "modpipe.simulation.simulator" in everything["modules"]
