"""Imports point one way: read from the source (ast, nothing imported), every import stays in its module's
layer or goes down, and no modules import each other in a circle. Function-local imports count: they run too.
"""

from __future__ import annotations

import ast
import fnmatch
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
# Import package -> its folder in the repository: pyproject's package-dir (one import namespace, `modpipe`).
PACKAGES = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]

# The layer order, bottom first. A module may import its own layer and the layers below it, never above.
# A module takes the highest layer with a pattern that matches it, so `modpipe.decision.cli` is a command.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("modpipe", "modpipe.settings", "modpipe.log", "modpipe.memory", "modpipe.schema",
                    "modpipe.schemas", "modpipe.configdoc", "modpipe.exits", "modpipe.output",
                    "modpipe.triton_models")),
    ("feature logic", ("modpipe.features", "modpipe.features.*")),
    ("services", ("modpipe.services", "modpipe.services.*")),
    ("text model", ("modpipe.textmodel", "modpipe.textmodel.*")),
    ("serving", ("modpipe.serving", "modpipe.serving.*")),
    ("evaluation", ("modpipe.evaluation", "modpipe.evaluation.*")),
    ("simulation", ("modpipe.simulation", "modpipe.simulation.*")),
    ("decision", ("modpipe.decision", "modpipe.decision.*")),
    ("streams", ("modpipe.streams", "modpipe.streams.*")),
    ("console", ("modpipe.console", "modpipe.console.*")),
    ("load generator", ("modpipe.loadgen", "modpipe.loadgen.*")),
    ("commands", ("*.cli", "*.__main__")),
)

# Inside `streams`: the general runtime never imports the moderation wiring nor the local stack. The wiring
# (moderation/) builds on the runtime; worker.py, cli.py and the local stack put the two together.
STREAMS_RUNTIME = ("modpipe.streams", "modpipe.streams.metrics", "modpipe.streams.waiting", "modpipe.streams.kafka", "modpipe.streams.kafka.*",
                   "modpipe.streams.state", "modpipe.streams.state.*", "modpipe.streams.checkpointing", "modpipe.streams.checkpointing.*",
                   "modpipe.streams.runtime", "modpipe.streams.runtime.*")
STREAMS_WIRING = ("modpipe.streams.moderation", "modpipe.streams.moderation.*", "modpipe.streams.local", "modpipe.streams.local.*",
                  "modpipe.streams.worker", "modpipe.streams.cli")
# (runtime module, wiring module) -> why that import is allowed anyway. None today.
RUNTIME_IMPORTS_OF_WIRING: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # path:line of the import statement

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({self.where})"


def module_files(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = path.relative_to(root / folder).with_suffix("").parts
            if not all(part.isidentifier() for part in parts):
                continue  # not importable: a Triton model's python-backend code (triton_models/*/*/1/model.py)
            name = ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))
            out[name] = path
    return out


def _known(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is one of our modules (None for third-party and stdlib)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            # `from pkg import sub` depends on pkg.sub when that is a module, else on pkg
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}"
        for name in names:
            target = _known(name, modules)
            if target and target != module:
                edges.append(Edge(module, target, where))
    return edges


def import_graph(root: Path = ROOT) -> list[Edge]:
    modules = module_files(root)
    return [e for m, p in modules.items() for e in imports_of(m, p, modules)]


def layer_of(module: str) -> int:
    for i in reversed(range(len(LAYERS))):
        if any(fnmatch.fnmatchcase(module, pattern) for pattern in LAYERS[i][1]):
            return i
    raise LookupError(module)


def upward(edges: list[Edge]) -> list[str]:
    return [f"{e}: layer '{LAYERS[layer_of(e.source)][0]}' imports '{LAYERS[layer_of(e.target)][0]}' above it"
            for e in edges if layer_of(e.target) > layer_of(e.source)]


def _matches(module: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(module, pattern) for pattern in patterns)


def runtime_into_wiring(edges: list[Edge]) -> list[str]:
    return [f"{e}: the streams runtime imports the moderation wiring or the local stack" for e in edges
            if _matches(e.source, STREAMS_RUNTIME) and _matches(e.target, STREAMS_WIRING)
            and (e.source, e.target) not in RUNTIME_IMPORTS_OF_WIRING]


def cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One circle per strongly connected component of more than one module (Tarjan), as its edges."""
    out_edges: dict[str, list[Edge]] = {}
    for e in edges:
        out_edges.setdefault(e.source, []).append(e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for e in out_edges.get(v, ()):
            if e.target not in index:
                visit(e.target)
                low[v] = min(low[v], low[e.target])
            elif e.target in stack:
                low[v] = min(low[v], index[e.target])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(out_edges):
        if v not in index:
            visit(v)
    return [_circle(c, out_edges) for c in components]


def _circle(component: set[str], out_edges: dict[str, list[Edge]]) -> list[Edge]:
    """A path from the component's first module back to itself, inside the component (breadth first)."""
    start = min(component)
    came: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for e in out_edges.get(v, ()):
                if e.target == start:
                    path = [e]
                    while path[0].source != start:
                        path.insert(0, came[path[0].source])
                    return path
                if e.target in component and e.target not in came:
                    came[e.target] = e
                    nxt.append(e.target)
        frontier = nxt
    raise AssertionError(f"{component} is not strongly connected")


# ------------------------------------------------------------------------------------------------ the repo

@pytest.fixture(scope="module")
def graph() -> list[Edge]:
    return import_graph()


def test_the_graph_is_read_from_the_source(graph):
    pairs = {(e.source, e.target) for e in graph}
    # a module-level import, a function-local one and a `from package import module`
    assert ("modpipe.streams.worker", "modpipe.streams.moderation.agents") in pairs
    assert ("modpipe.streams.worker", "modpipe.decision.store") in pairs
    assert ("modpipe.decision.evaluate", "modpipe.decision.dataset") in pairs


def test_every_module_has_a_layer():
    unplaced = []
    for module in module_files():
        try:
            layer_of(module)
        except LookupError:
            unplaced.append(module)
    assert not unplaced, f"give these modules a layer in LAYERS ({__file__}): {unplaced}"


def test_no_import_runs_up_a_layer(graph):
    bad = upward(graph)
    assert not bad, "imports that run up a layer:\n" + "\n".join(bad)


def test_no_modules_import_each_other_in_a_circle(graph):
    found = cycles(graph)
    assert not found, "import circles:\n" + "\n".join(" then ".join(map(str, c)) for c in found)


def test_every_streams_module_is_runtime_or_wiring():
    unplaced = [m for m in module_files() if m.startswith(("modpipe.streams.", "modpipe.streams"))
                and _matches(m, STREAMS_RUNTIME) == _matches(m, STREAMS_WIRING)]
    assert not unplaced, f"put these in STREAMS_RUNTIME or STREAMS_WIRING ({__file__}): {unplaced}"


def test_the_streams_runtime_never_imports_the_moderation_wiring(graph):
    bad = runtime_into_wiring(graph)
    assert not bad, "imports from the runtime into the wiring:\n" + "\n".join(bad)


def test_the_runtime_exceptions_are_still_imports(graph):
    pairs = {(e.source, e.target) for e in graph}
    stale = [pair for pair in RUNTIME_IMPORTS_OF_WIRING if pair not in pairs]
    assert not stale, f"no longer imported, drop them from RUNTIME_IMPORTS_OF_WIRING: {stale}"


# ------------------------------------------------------------------------------------------------ the checker

def test_the_checker_names_a_backwards_arrow_and_a_circle(tmp_path):
    for name, body in {"features/__init__.py": "", "features/a.py": "from modpipe.loadgen import b\n",
                       "loadgen/__init__.py": "", "loadgen/b.py": "from . import c\n",
                       "loadgen/c.py": "import modpipe.loadgen.b\nimport os\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    edges = import_graph(tmp_path)
    assert {(e.source, e.target) for e in edges} == {
        ("modpipe.features.a", "modpipe.loadgen.b"), ("modpipe.loadgen.b", "modpipe.loadgen.c"),
        ("modpipe.loadgen.c", "modpipe.loadgen.b")}
    bad = upward(edges)
    assert len(bad) == 1 and bad[0].startswith("modpipe.features.a -> modpipe.loadgen.b (")
    assert "features/a.py:1" in bad[0]
    [circle] = cycles(edges)
    assert [(e.source, e.target) for e in circle] == [("modpipe.loadgen.b", "modpipe.loadgen.c"),
                                                      ("modpipe.loadgen.c", "modpipe.loadgen.b")]


def test_a_module_takes_the_highest_layer_that_matches():
    assert LAYERS[layer_of("modpipe.decision.cli")][0] == "commands"
    assert LAYERS[layer_of("modpipe.decision.train")][0] == "decision"
    assert LAYERS[layer_of("modpipe.settings")][0] == "foundation"
    with pytest.raises(LookupError):
        layer_of("elsewhere.module")


def test_the_checker_names_the_runtime_importing_the_wiring(tmp_path):
    for name, body in {"streams/__init__.py": "", "streams/runtime/__init__.py": "",
                       "streams/runtime/runner.py": "from modpipe.streams.moderation import agents\n",
                       "streams/moderation/__init__.py": "",
                       "streams/moderation/agents.py": "from modpipe.streams.runtime.runner import x\n",
                       "streams/worker.py": "import modpipe.streams.moderation.agents\nimport modpipe.streams.runtime.runner\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    bad = runtime_into_wiring(import_graph(tmp_path))
    assert len(bad) == 1 and bad[0].startswith("modpipe.streams.runtime.runner -> modpipe.streams.moderation.agents (")
    assert "streams/runtime/runner.py:1" in bad[0]
