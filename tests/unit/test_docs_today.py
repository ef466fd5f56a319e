"""Every page in docs/ reads in minutes and opens with what is true now: at most 300 lines, and (the generated
configuration reference aside) a "Today's numbers" table near its top whose rows each name the number, the
machine, the commit measured and the command that measures it again. Superseded measurements live in git."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md"))
MAX_LINES = 300
# Pages without measurements of their own: generated from the settings spec (`make docs`), never hand-edited.
WITHOUT_NUMBERS = {"configuration.md"}
HEADING = "## Today's numbers"
HEADING_WITHIN = 12  # lines from the top: the title, a one-line purpose, then the table
COLUMNS = ["what", "number", "machine", "commit", "command"]
_COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def todays_numbers_problems(markdown: str) -> list[str]:
    """What keeps a page from opening with a "Today's numbers" table: [] when it does."""
    lines = markdown.splitlines()
    headings = [i for i, line in enumerate(lines) if line.startswith("## ")]
    if not headings or lines[headings[0]].strip() != HEADING:
        return [f"the first section is not {HEADING!r}"]
    if headings[0] >= HEADING_WITHIN:
        return [f"{HEADING!r} starts on line {headings[0] + 1}, after line {HEADING_WITHIN}"]
    end = headings[1] if len(headings) > 1 else len(lines)
    section = lines[headings[0] + 1:end]
    start = next((i for i, line in enumerate(section) if line.startswith("|")), None)
    if start is None:
        return [f"{HEADING!r} holds no table"]
    table = []
    for line in section[start:]:
        if not line.startswith("|"):
            break
        table.append(line)
    problems = []
    if [c.lower() for c in _cells(table[0])] != COLUMNS:
        problems.append(f"the table's columns are {_cells(table[0])}, not {COLUMNS}")
    rows = table[2:]
    if not rows:
        problems.append("the table has no rows")
    for row in rows:
        cells = _cells(row)
        if len(cells) != len(COLUMNS) or not all(cells):
            problems.append(f"a row without all {len(COLUMNS)} cells: {row[:80]}")
        elif not _COMMIT.search(cells[COLUMNS.index("commit")]):
            problems.append(f"a row without a commit: {row[:80]}")
    return problems


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_is_short(path):
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, (f"{path.relative_to(ROOT)} has {n} lines (at most {MAX_LINES}): state what is true now, "
                            "leave superseded measurements to git, or split the page by topic")


@pytest.mark.parametrize("path", [p for p in PAGES if p.name not in WITHOUT_NUMBERS],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_page_with_numbers_opens_with_todays_numbers(path):
    problems = todays_numbers_problems(path.read_text())
    assert not problems, f"{path.relative_to(ROOT)}: " + "; ".join(problems)


def test_the_pages_without_numbers_exist():
    assert WITHOUT_NUMBERS <= {p.name for p in PAGES}


GOOD = """# Page

What it is for.

## Today's numbers

| what | number | machine | commit | command |
|---|---|---|---|---|
| posts/s | 8,498 | a 2-core Xeon | 01909aa | `modpipe bench features` |

## More
"""


def test_a_good_page_passes():
    assert todays_numbers_problems(GOOD) == []


@pytest.mark.parametrize("broken, problem", [
    (GOOD.replace("## Today's numbers", "## Numbers"), "first section"),
    ("# Page\n\n" + "text\n" * 20 + GOOD.split("\n", 3)[3], "starts on line"),
    (GOOD.replace("| what | number | machine | commit | command |", "| what | number | machine | command |"),
     "columns"),
    (GOOD.replace("| 01909aa |", "| yesterday |"), "without a commit"),
    (GOOD.replace("| a 2-core Xeon |", "|  |"), "cells"),
    (GOOD.replace("| posts/s | 8,498 | a 2-core Xeon | 01909aa | `modpipe bench features` |\n", ""), "no rows"),
    (GOOD.split("| what")[0] + "## More\n", "no table"),
])
def test_a_page_without_todays_table_is_reported(broken, problem):
    problems = todays_numbers_problems(broken)
    assert problems and problem in problems[0], problems
