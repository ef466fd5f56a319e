"""The Makefile's two commands need what they say: `make demo` needs Python, a JDK and Maven (checked with a clear
message), never the test tools; `make test` installs those. Read with `make -n` (nothing runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST_TOOLS = ("kcat", "kubectl", "promtool", "chromium", "chromedriver", "install-test-tools")


def dry_run(target: str, tmp_path: Path) -> str:
    # a venv path that does not exist, so that make plans the whole setup
    out = subprocess.run(["make", "-n", "-B", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_checks_prerequisites_and_needs_no_test_tool(tmp_path):
    plan = dry_run("demo", tmp_path)
    assert "check-prerequisites.sh" in plan and "modpipe demo" in plan
    assert not [t for t in TEST_TOOLS if t in plan]
    assert "install-test-tools.sh" in dry_run("test", tmp_path)


def test_the_prerequisite_check_names_what_is_missing(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sed"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {**os.environ, "PATH": str(bin_dir), "PYTHON": sys.executable}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "check-prerequisites.sh")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1
    assert "JDK >= 17" in out.stderr and "Maven" in out.stderr and "Python" not in out.stderr
    if shutil.which("java") and shutil.which("mvn"):
        ok = subprocess.run(["bash", str(ROOT / "scripts" / "check-prerequisites.sh")], capture_output=True, text=True,
                            timeout=60)
        assert ok.returncode == 0, ok.stderr
