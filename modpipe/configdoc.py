"""The configuration reference, docs/configuration.md, generated from `SETTINGS_SPEC`.

    python -m modpipe.configdoc docs/configuration.md   # (or `make docs`) write it
    python -m modpipe.configdoc --check docs/configuration.md   # exit 1 when it differs from the spec

Sections follow the `# -- name` comments of the spec in modpipe/settings.py.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from modpipe import settings as settings_module
from modpipe.settings import SETTINGS_SPEC, Spec

REGENERATE = "python -m modpipe.configdoc docs/configuration.md  (or: make docs)"

# Defaults computed from the environment when the spec is read: shown as the rule, not this machine's path.
COMPUTED_DEFAULTS = {
    "MODPIPE_STATE_DIR": "$XDG_STATE_HOME/modpipe, else ~/.local/state/modpipe",
    "MODPIPE_CACHE_DIR": "$XDG_CACHE_HOME/modpipe, else ~/.cache/modpipe",
}

_SECTION = re.compile(r"^\s*# -- (?P<name>.+?)\s*$")
_ENTRY = re.compile(r'^\s*"(?P<key>\w+)":\s*Spec\(')


def sections(source: str) -> dict[str, str]:
    """{setting name: section title} from the `# -- title` comments above the spec's entries."""
    out, current = {}, "Other"
    for line in source.splitlines():
        if m := _SECTION.match(line):
            current = m["name"]
        elif m := _ENTRY.match(line):
            out[m["key"]] = current
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(spec: Spec) -> str:
    default = COMPUTED_DEFAULTS.get(spec.env, spec.default)
    shown = f"`{_cell(default)}`" if default else "(empty)"
    return f"| `{spec.env}` | {shown} | {_cell(spec.help)} |"


def render(spec: dict[str, Spec] = SETTINGS_SPEC, source: str | None = None) -> str:
    if source is None:
        source = Path(settings_module.__file__).read_text()
    by_section: dict[str, list[Spec]] = {}
    titles = sections(source)
    for name, s in spec.items():
        by_section.setdefault(titles.get(name, "Other"), []).append(s)
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from SETTINGS_SPEC in modpipe/settings.py; do not edit. Regenerate: "
        f"{REGENERATE} -->",
        "",
        "Every setting is an environment variable; `modpipe config` prints the effective values. With",
        "`KAFKA_BOOTSTRAP_SERVERS` and `TRITON_URL` set, nothing is started locally and the same code runs",
        "against Apache Kafka and NVIDIA's Triton container. A value that cannot be used stops every command",
        "with `modpipe: configuration error: ...` (exit 2).",
    ]
    for title, specs in by_section.items():
        lines += ["", f"## {title[:1].upper()}{title[1:]}", "", "| Variable | Default | Meaning |", "|---|---|---|"]
        lines += [_row(s) for s in specs]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modpipe.configdoc",
                                     description="Write the configuration reference generated from the settings spec.")
    parser.add_argument("path", type=Path, help="the markdown file to write (docs/configuration.md)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file differs")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.path.read_text() if args.path.exists() else None
        if current != text:
            print(f"{args.path} differs from the settings spec; regenerate: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    args.path.parent.mkdir(parents=True, exist_ok=True)
    args.path.write_text(text)
    print(f"wrote {args.path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
