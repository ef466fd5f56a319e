"""pyproject.toml and constraints.txt agree: every direct dependency, optional ones included, is pinned in
constraints.txt (what `make setup`, CI and the images install) at a version its pyproject range allows. A range
that excludes the pin breaks a plain `pip install modpipe` beside the tested set, or the other way round."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9_.\-\[\],]+)==(\S+)", line)
            assert m, f"constraints.txt: not an exact pin: {line!r}"
            out[canonicalize_name(m.group(1).split("[")[0])] = m.group(2)
    return out


def requirements() -> list[tuple[str, Requirement]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    for extra, items in project.get("optional-dependencies", {}).items():
        reqs += [(f"[{extra}]", Requirement(r)) for r in items]
    return reqs


def test_every_dependency_is_pinned_within_its_range():
    pinned = pins()
    wrong = []
    for where, req in requirements():
        version = pinned.get(canonicalize_name(req.name))
        if version is None:
            wrong.append(f"{where} {req}: not pinned in constraints.txt")
        elif not req.specifier.contains(version, prereleases=True):
            wrong.append(f"{where} {req}: constraints.txt pins {version}")
    assert not wrong, wrong


def test_numpy_2_is_allowed_and_the_tested_set_keeps_1_26_for_the_embedded_tritons_tokenizer():
    # GPU images ship numpy 2 under PyTorch: installing modpipe there must not downgrade it. The workers and
    # spam_text run under numpy 2 (triton_models/README.md); only the ensemble's tokenizer, inside Triton
    # 2.51's python stub, needs < 2, and the local stack runs that stub in this environment.
    (numpy,) = [r for where, r in requirements() if where == "dependencies" and r.name == "numpy"]
    assert numpy.specifier.contains("2.1.0") and numpy.specifier.contains("1.26.4")
    assert pins()["numpy"].startswith("1.")
