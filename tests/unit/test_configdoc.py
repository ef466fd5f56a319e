"""docs/configuration.md is what the settings spec generates; the generator's sections, defaults, escaping."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from modpipe.configdoc import REGENERATE, render, sections
from modpipe.settings import SETTINGS_SPEC, Spec

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"


def test_the_configuration_reference_is_generated_from_the_spec():
    assert DOC.exists(), f"docs/configuration.md is missing; generate it: {REGENERATE}"
    assert DOC.read_text() == render(), f"docs/configuration.md differs from the settings spec; regenerate: {REGENERATE}"


def test_every_setting_is_in_the_reference_once():
    text = render()
    assert all(text.count(f"| `{s.env}` |") == 1 for s in SETTINGS_SPEC.values())


def test_sections_follow_the_spec_comments_and_cells_are_escaped():
    source = '''SETTINGS_SPEC = {
    # -- paths
    "a": Spec("A", "", "x"),
    # -- Kafka things
    "b": Spec("B", "1", "y"),
}'''
    assert sections(source) == {"a": "paths", "b": "Kafka things"}
    spec = {"a": Spec("A", "", "one | two"), "b": Spec("B", "1", "y"), "c": Spec("C", "z", "w")}
    text = render(spec, source)
    assert "## Paths\n\n| Variable | Default | Meaning |\n|---|---|---|\n| `A` | (empty) | one \\| two |" in text
    assert "## Kafka things" in text and "## Other\n" in text and "| `C` | `z` | w |" in text


def test_computed_defaults_do_not_depend_on_the_machine():
    text = render()
    assert str(Path.home()) not in text and "~/.local/state/modpipe" in text


def test_check_mode_names_the_command_that_regenerates(tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text("old\n")
    cmd = [sys.executable, "-m", "modpipe.configdoc"]
    out = subprocess.run([*cmd, "--check", str(stale)], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1 and "python -m modpipe.configdoc docs/configuration.md" in out.stderr
    assert subprocess.run([*cmd, str(stale)], capture_output=True, cwd=ROOT).returncode == 0
    assert subprocess.run([*cmd, "--check", str(stale)], capture_output=True, cwd=ROOT).returncode == 0
    assert stale.read_text() == render()
