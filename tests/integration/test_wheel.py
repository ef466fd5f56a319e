"""The wheel as a platform installs it: built from this checkout, installed into a fresh virtualenv that already
holds PyPI's distributions named `features` and `console` (two of the folder names this repository keeps at its
top). modpipe installs one import package, `modpipe`: nothing of theirs is overwritten, and the worker, the
command line and the Triton model templates work from site-packages, not from the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Other projects' distributions whose import names are folders of this repository (pinned: what they ship is
# part of the test). Their own dependencies come too.
NEIGHBOURS = ["features==0.5.12", "console==0.9912"]

pytestmark = pytest.mark.integration


def run(cmd: list[str], cwd: Path, timeout: int = 900, **kw) -> subprocess.CompletedProcess:
    # a clean environment: no PYTHONPATH, and a working directory outside the checkout, so that only what is
    # installed in the virtualenv can be imported
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    out = subprocess.run(cmd, cwd=cwd, env={**env, **kw.pop("env", {})}, capture_output=True, text=True,
                         timeout=timeout, **kw)
    assert out.returncode == 0, f"{cmd} exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)], cwd=dist)
    [path] = dist.glob("modpipe-*.whl")
    return path


def test_the_wheel_holds_one_import_package_and_the_triton_templates(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"modpipe"}
    for path in ("modpipe/streams/worker.py", "modpipe/features/state.py", "modpipe/console/static/console.js",
                 "modpipe/triton_models/common/spam_tokenizer/config.pbtxt",
                 "modpipe/triton_models/cpu/spam_text/1/model.py", "modpipe/schemas/post.v1.json"):
        assert path in names, path
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in meta
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_installed_beside_features_and_console_it_overwrites_nothing_and_runs(wheel, tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py = venv / "bin" / "python"
    run([str(py), "-m", "pip", "install", "-q", *NEIGHBOURS], cwd=tmp_path)
    site = Path(run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    cwd=tmp_path).stdout.strip())
    theirs = {p: p.read_bytes() for p in (site / "features").rglob("*") if p.is_file()}
    theirs |= {p: p.read_bytes() for p in (site / "console").rglob("*") if p.is_file()}
    assert theirs

    # the core dependencies at the tested pins (from pip's cache after `make setup`)
    install = run([str(py), "-m", "pip", "install", "-c", str(ROOT / "constraints.txt"), str(wheel)], cwd=tmp_path)
    assert "clash" not in (install.stdout + install.stderr).lower()
    assert {p: p.read_bytes() for p in theirs if p.is_file()} == theirs, "modpipe overwrote their files"

    modpipe = str(venv / "bin" / "modpipe")
    assert "usage: modpipe" in run([modpipe, "--help"], cwd=tmp_path).stdout
    config = json.loads(run([modpipe, "config", "--json"], cwd=tmp_path).stdout)
    assert config["MODPIPE_TRITON_REPO_SRC"] == ""
    probe = ("import json, features, console, modpipe.streams.worker\n"
             "from modpipe.serving.repository import source_dir\n"
             "print(json.dumps({'features': features.__file__, 'console': console.__file__,\n"
             "                  'worker': modpipe.streams.worker.__file__, 'templates': str(source_dir())}))")
    found = json.loads(run([str(py), "-c", probe], cwd=tmp_path).stdout.strip().splitlines()[-1])
    assert found["features"] == str(site / "features" / "__init__.py")  # PyPI's, still
    assert found["console"] == str(site / "console" / "__init__.py")
    assert found["worker"] == str(site / "modpipe" / "streams" / "worker.py")
    assert found["templates"] == str(site / "modpipe" / "triton_models")
    # a worker's deciders and its client-side text path, with the core dependencies alone
    worker = ("import numpy as np, lightgbm as lgb, sys\n"
              "from modpipe.decision.model import DECISION_FEATURES, DecisionModel\n"
              "import modpipe.streams.worker as w, modpipe.serving.client, modpipe.textmodel.tokenize\n"
              "from modpipe.settings import Settings\n"
              "x = np.random.default_rng(0).random((200, len(DECISION_FEATURES)))\n"
              "b = lgb.train({'objective': 'binary', 'verbose': -1, 'min_data_in_leaf': 5},\n"
              "              lgb.Dataset(x, (x[:, 0] > .5).astype(float), feature_name=list(DECISION_FEATURES)), 3)\n"
              "path = DecisionModel(b, list(DECISION_FEATURES), DecisionModel.version_of(b)).save(sys.argv[1])\n"
              "s = Settings.from_env(decision_model=str(path))\n"
              "[v] = w.make_decider(s, 'text-model-v').decide_many([{'text_probability': 0.9}])\n"
              "print(v.verdict)\n")
    env = {"MODPIPE_CACHE_DIR": str(tmp_path / "cache"), "MODPIPE_STATE_DIR": str(tmp_path / "state")}
    verdict = run([str(py), "-c", worker, str(tmp_path / "model")], cwd=tmp_path, env=env).stdout.split()[-1]
    assert verdict in ("allow", "review", "block")
    run([str(py), "-m", "pip", "check"], cwd=tmp_path)
