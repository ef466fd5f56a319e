"""What commands print. With `--json`: one JSON document on stdout, for machines. Without: a rendering for
people. Progress bars go to stderr and only when it is a terminal: in a pipe or a log they would be a
stream of carriage returns."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Mapping


def print_json(data) -> None:
    """One JSON document on one line of stdout."""
    print(json.dumps(data, default=str))


def emit(data, as_json: bool, human=None) -> None:
    """`data` as JSON when `as_json`, else `human(data)` (default: `render(data)`; nothing for an empty one)."""
    if as_json:
        print_json(data)
        return
    text = (human or render)(data)
    if text:
        print(text)


def _scalar(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def render(data, indent: int = 0) -> str:
    """A readable rendering of a JSON-like report: one `key  value` line per field, names aligned, nested
    mappings indented under their key, short lists of scalars inline."""
    pad = "  " * indent
    if isinstance(data, Mapping):
        if not data:
            return f"{pad}(none)"
        width = max(len(str(k)) for k in data)
        lines = []
        for key, value in data.items():
            if isinstance(value, Mapping) or (_is_list(value) and not _scalars(value)):
                lines.append(f"{pad}{key}:" if value else f"{pad}{str(key).ljust(width)}  (none)")
                if value:
                    lines.append(render(value, indent + 1))
            else:
                lines.append(f"{pad}{str(key).ljust(width)}  {_inline(value)}")
        return "\n".join(lines)
    if _is_list(data):
        if _scalars(data):
            return pad + _inline(data)
        return "\n".join(f"{pad}- " + render(item, indent + 1).lstrip() for item in data)
    return pad + _scalar(data)


def _is_list(value) -> bool:
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))


def _scalars(values) -> bool:
    return all(not isinstance(v, Mapping) and not _is_list(v) for v in values)


def _inline(value) -> str:
    if _is_list(value):
        return ", ".join(_scalar(v) for v in value) or "(none)"
    return _scalar(value)


def progress_bar(iterable=None, *, enabled: bool = True, stream=None, **kwargs):
    """tqdm on stderr, shown only when `enabled` and stderr is a terminal. tqdm is imported here, when a bar
    is made: the worker never makes one and never loads it."""
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    shown = enabled and _isatty(stream)
    return tqdm(iterable, file=stream, disable=not shown, **kwargs)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False
