"""The README's "Today's numbers" are the rows they name: each bullet links a page of docs/ and quotes the start of
the rows it takes its figures from ("latency at 5 posts/s"), and every measured figure in the bullet (a number of
two or more digits, or with a decimal point) stands in one of those rows. A row that moves without the README
(or the other way round) fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTION_START = "**Today's numbers**"
SECTION_END = "## Two commands"
_LINK = re.compile(r"\[[^\]]*\]\((docs/[\w.-]+\.md)#todays-numbers\)((?::\s*\"[^\"]+\"(?:;\s*\"[^\"]+\")*))")
_QUOTED = re.compile(r"\"([^\"]+)\"")
# a measured figure: 10 or more, or with a decimal point; not part of a name (H200, p99, f2a0d67)
_FIGURE = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+\.\d+|\d{2,})(?![\w])")


def bullets(readme: str) -> list[str]:
    section = readme.split(SECTION_START, 1)[1].split(SECTION_END, 1)[0]
    return [" ".join(b.split()) for b in re.split(r"\n- ", "\n" + section.split("\n- ", 1)[1]) if b.strip()]


def table_rows(page: Path) -> list[str]:
    text = page.read_text()
    section = text.split("## Today's numbers", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("|") and not line.startswith("|---")]


def first_cell(row: str) -> str:
    return row.strip().strip("|").split("|", 1)[0].strip()


def figures(text: str) -> list[str]:
    return _FIGURE.findall(text.replace("**", ""))


def problems(bullet: str, root: Path = ROOT) -> list[str]:
    cited = _LINK.findall(bullet)
    if not cited:
        return [f"no [page](docs/PAGE.md#todays-numbers): \"row\" citation in: {bullet[:80]}"]
    rows, out = [], []
    for page, names in cited:
        table = table_rows(root / page)
        for name in _QUOTED.findall(names):
            found = [r for r in table if first_cell(r).startswith(name)]
            if not found:
                out.append(f"{page} has no row starting {name!r}")
            rows += found
    # the figures of the bullet's own text, citations left out
    text = _LINK.sub("", bullet)
    cells = " ".join(rows).replace("**", "")
    for figure in figures(text):
        if not re.search(rf"(?<![\w.,]){re.escape(figure)}(?![\w]|,\d)", cells):
            out.append(f"{figure} is in none of the rows cited by: {bullet[:80]}")
    return out


def test_every_figure_of_the_readme_is_in_the_row_it_cites():
    found = bullets((ROOT / "README.md").read_text())
    assert len(found) >= 4
    bad = [p for b in found for p in problems(b)]
    assert not bad, "\n".join(bad)


def test_the_checker_finds_a_figure_the_row_lacks_and_a_row_that_is_gone(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text(
        "# X\n\n## Today's numbers\n\n| what | number |\n|---|---|\n| latency at 5 posts/s | **71-74** / 1,109 ms |\n")
    good = 'latency p50 71-74, p99 1,109 ms on 2 cores ([docs/x.md](docs/x.md#todays-numbers): "latency at 5")'
    assert problems(good, tmp_path) == []
    assert problems(good.replace("1,109", "1,079"), tmp_path) == [
        f"1,079 is in none of the rows cited by: {good.replace('1,109', '1,079')[:80]}"]
    assert problems(good.replace('"latency at 5"', '"throughput"'), tmp_path)[0] == \
        "docs/x.md has no row starting 'throughput'"
    assert figures("H200 p99 at 50% of f2a0d67: 0.947 and 8,498, 3 runs") == ["50", "0.947", "8,498"]
