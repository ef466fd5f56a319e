"""pyproject.toml and constraints.txt agree: every direct dependency, optional ones included, is pinned in
constraints.txt (what `make setup`, CI and the images install) at a version its pyproject range allows. A range
that excludes the pin breaks a plain `pip install modpipe` beside the tested set, or the other way round.
And the runtime dependencies are what the code runs: each is used by the packages, and the packages use
nothing that only the dev extra installs."""

from __future__ import annotations

import ast
import re
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
# what pyproject installs: one import package, modpipe, from these folders (its package-dir)
FOLDERS = tuple(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values())

# Runtime dependencies the packages use without an import statement that names them.
USED_WITHOUT_IMPORT = {
    "nvidia-pytriton": "its tritonserver binary (modpipe/serving/server.py finds it with find_spec)",
}


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
    # the local stack's extra carries the bound, so `pip install modpipe[local]` gets a numpy its Triton reads
    (local,) = [r for where, r in requirements() if where == "[local]" and r.name == "numpy"]
    assert not local.specifier.contains("2.0.0") and local.specifier.contains(pins()["numpy"])


def modules_used(source: str) -> set[str]:
    """Top-level names a module imports (function-local imports too: they run) or looks up with find_spec."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "find_spec"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value.split(".")[0])
    return names


def distributions_used() -> dict[str, set[str]]:
    """Installed distribution -> the package files that use it."""
    providers = packages_distributions()
    used: dict[str, set[str]] = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for name in modules_used(path.read_text()):
                for dist in providers.get(name, ()):
                    used.setdefault(canonicalize_name(dist), set()).add(str(path.relative_to(ROOT)))
    return used


def test_the_reader_sees_imports_and_lookups():
    source = "import a.b\nfrom c import d\nfrom . import e\ndef f():\n    import g\n    importlib.util.find_spec('h')\n"
    assert modules_used(source) == {"a", "c", "g", "h"}


def test_every_runtime_dependency_is_used_by_the_packages():
    used = distributions_used()
    unused = [str(req) for where, req in requirements() if where == "dependencies"
              and canonicalize_name(req.name) not in used and req.name not in USED_WITHOUT_IMPORT]
    assert not unused, f"runtime dependencies nothing under {FOLDERS} uses: move them to the extra that needs them"


def test_the_packages_use_no_dev_only_dependency():
    """A package only the dev extra installs is missing from `pip install modpipe` and from the worker image."""
    elsewhere = {canonicalize_name(req.name) for where, req in requirements() if where != "[dev]"}
    dev_only = {canonicalize_name(req.name) for where, req in requirements() if where == "[dev]"} - elsewhere
    assert "jsonschema" in dev_only  # the tests' schema validator; the code never validates with it
    used = distributions_used()
    wrong = {dist: sorted(files) for dist, files in used.items() if dist in dev_only}
    assert not wrong, f"runtime code imports dev-only packages: {wrong}"


def test_what_the_worker_imports_comes_with_the_core_dependencies():
    """`pip install modpipe` (no extra) runs a worker: every third-party import of the modules `modpipe worker`
    loads, followed through our own imports (function-local ones too), is a core dependency's or one they
    require (protobuf comes with tritonclient[grpc])."""
    from tests.unit.test_layering import import_graph, module_files

    modules = module_files()
    edges: dict[str, set[str]] = {}
    for e in import_graph():
        edges.setdefault(e.source, set()).add(e.target)
    todo, seen = ["modpipe.streams.worker"], set()
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += edges.get(m, ())
    core = core_closure()
    providers = packages_distributions()
    outside = {}
    for m in sorted(seen):
        for name in modules_used(modules[m].read_text()):
            for dist in providers.get(name, ()):
                if canonicalize_name(dist) not in core and canonicalize_name(dist) != "modpipe":
                    outside.setdefault(canonicalize_name(dist), []).append(m)
    assert "modpipe.streams.moderation.scoring" in seen and "modpipe.decision.store" in seen
    assert not outside, f"the worker's modules import distributions outside the core dependencies: {outside}"


def core_closure() -> set[str]:
    """modpipe's core dependencies and, as installed here, everything they require (with the extras named)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import requires as declared_by

    todo = [r for where, r in requirements() if where == "dependencies"]
    seen: set[tuple[str, frozenset]] = set()
    names: set[str] = set()
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        names.add(key[0])
        try:
            lines = declared_by(req.name) or []
        except PackageNotFoundError:
            continue
        for line in lines:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in (req.extras or {""})):
                todo.append(sub)
    return names
