"""pyproject's package list and package data ship every file the repository keeps in the folders it installs:
one import package, `modpipe`, mapped from the top-level folders (package-dir). A folder added without a line in
pyproject would be missing from the wheel (tests/integration/test_wheel.py builds and installs one)."""

from __future__ import annotations

import fnmatch
import subprocess
from pathlib import Path, PurePosixPath

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def package_folder(package: str) -> PurePosixPath:
    """A package's folder in the repository, through the nearest mapped ancestor (as setuptools resolves it)."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        mapped = SETUPTOOLS["package-dir"].get(".".join(parts[:n]))
        if mapped is not None:
            return PurePosixPath(mapped, *parts[n:])
    raise AssertionError(f"{package}: no package-dir entry above it")


def shipped(path: PurePosixPath) -> bool:
    """Whether the configuration puts this repository file into the wheel."""
    folders = {package_folder(p): p for p in SETUPTOOLS["packages"]}
    for parent in path.parents:
        package = folders.get(parent)
        if package is None:
            continue
        relative = str(path.relative_to(parent))
        if path.suffix == ".py" and path.parent == parent:
            return True
        return any(fnmatch.fnmatchcase(relative, pattern)
                   for pattern in SETUPTOOLS.get("package-data", {}).get(package, []))
    return False


def tracked_files() -> list[PurePosixPath]:
    folders = sorted(set(SETUPTOOLS["package-dir"].values()))
    out = subprocess.run(["git", "ls-files", "--", *folders], cwd=ROOT, capture_output=True, text=True, check=True)
    return [PurePosixPath(line) for line in out.stdout.splitlines()]


def test_one_import_package():
    assert all(p == "modpipe" or p.startswith("modpipe.") for p in SETUPTOOLS["packages"])
    assert all(p == "modpipe" or p.startswith("modpipe.") for p in SETUPTOOLS["package-dir"])


def test_every_tracked_file_of_an_installed_folder_ships():
    files = tracked_files()
    assert PurePosixPath("triton_models/cpu/spam_text/1/model.py") in files
    missing = [str(f) for f in files if not shipped(f)]
    assert not missing, f"not in the wheel (add the folder to packages or the file to package-data): {missing}"


def test_every_listed_package_is_a_folder():
    absent = [p for p in SETUPTOOLS["packages"] if not (ROOT / package_folder(p)).is_dir()]
    assert not absent, absent


def test_the_checker_sees_a_file_outside_the_configuration():
    assert shipped(PurePosixPath("streams/worker.py"))
    assert shipped(PurePosixPath("triton_models/common/spam_tokenizer/1/model.py"))
    assert not shipped(PurePosixPath("triton_models/cpu/spam_text/2/model.py"))
    assert not shipped(PurePosixPath("streams/newfolder/module.py"))
