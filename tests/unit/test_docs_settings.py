"""The pages agree with the settings: every setting a page names is declared in modpipe/settings.py (the
configuration reference is generated from it: test_configdoc.py), and what deploy/README.md says the workers'
transaction timeout is, is what the worker uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from modpipe.streams.worker import transaction_timeout_s

from modpipe.settings import SETTINGS_SPEC, Settings

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "deploy" / "README.md", ROOT / "triton_models" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
DECLARED = {spec.env for spec in SETTINGS_SPEC.values()}
_SETTING = re.compile(r"\b(MODPIPE_[A-Z0-9_]*[A-Z0-9])\b")
# environment variables pages name that are not settings of the Settings object: read by the tools that use them
NOT_SETTINGS = {"MODPIPE_MODEL_DIR_GPU"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_setting_a_page_names_is_declared(page):
    unknown = sorted({m for m in _SETTING.findall(page.read_text())} - DECLARED - NOT_SETTINGS)
    assert not unknown, f"{page.relative_to(ROOT)} names settings modpipe/settings.py does not declare: {unknown}"


def test_deploy_readme_gives_the_transaction_timeout_the_worker_computes():
    text = " ".join((ROOT / "deploy" / "README.md").read_text().split())
    m = re.search(r"\((\d+) s with the defaults, whatever the text-model settings", text)
    assert m, "deploy/README.md no longer states the workers' transaction timeout"
    defaults = float(m.group(1))
    for env in ({}, {"MODPIPE_TEXT_MODEL_OUTAGE_POLICY": "wait"}, {"MODPIPE_TEXT_MODEL": "off"},
                {"MODPIPE_TEXT_MODEL_OUTAGE_S": "600"}):
        assert transaction_timeout_s(Settings.from_env(env)) == defaults, env
