"""faust-streaming and aiokafka are pinned exactly: streams/ reaches into their private internals."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import pytest

from streams import kafka_compat

ROOT = Path(__file__).resolve().parents[2]


def test_installed_versions_are_the_checked_ones_and_every_pin_agrees():
    constraints = dict(re.findall(r"^([a-z0-9-]+)==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M))
    pyproject = (ROOT / "pyproject.toml").read_text()
    for name, wanted in kafka_compat.CHECKED_AGAINST.items():
        assert version(name) == wanted, f"{name} {version(name)} installed, the patches were checked against {wanted}"
        assert constraints[name] == wanted, f"constraints.txt pins {name}=={constraints[name]}"
        assert re.search(rf'"{name}(\[[a-z]+\])?=={re.escape(wanted)}"', pyproject), f"pyproject must pin {name}=={wanted}"
    kafka_compat.check_versions()


def test_another_version_stops_the_worker_before_it_patches_anything():
    with pytest.raises(kafka_compat.UncheckedVersion, match="aiokafka"):
        kafka_compat.check_versions(lambda name: "0.15.0" if name == "aiokafka" else version(name))
    with pytest.raises(kafka_compat.UncheckedVersion, match="faust-streaming"):
        kafka_compat.check_versions(lambda name: "0.16.0" if name == "faust-streaming" else version(name))
