"""Printing results: JSON on stdout (nothing else there), aligned tables for people.

Progress goes to stderr through ``turboinfer.progress``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import orjson


def print_json(data: Any) -> None:
    """Machine-readable output: one JSON document on stdout."""
    sys.stdout.write(
        orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode()
    )
    sys.stdout.write("\n")
    sys.stdout.flush()


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table; floats get 2 decimals, numbers align right, text left."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.2f}"
        return str(value)

    text_rows = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in text_rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row, raw in zip(text_rows, rows, strict=True):
        cells = [
            c.rjust(w) if isinstance(v, int | float) else c.ljust(w)
            for c, w, v in zip(row, widths, raw, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
