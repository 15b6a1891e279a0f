"""A server log read for allocation failures: engines report them as text, not as a
metric (ONNX Runtime's "Failed to allocate memory", C++'s std::bad_alloc, Python's
MemoryError, the kernel's OOM killer), so the count of such lines is the evidence."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from turboinfer.errors import InvalidInputError

OOM = re.compile(r"out of memory|failed to allocate|bad_alloc|MemoryError|"
                 r"cannot allocate memory|oom-kill|Killed process", re.IGNORECASE)
CONTEXT_CHARS = 80  # either side of the first match, quoted as evidence


@dataclass(frozen=True)
class LogCounts:
    path: str
    lines: int
    oom_lines: int
    first_oom: str | None   # the first match with some of its line around it


def read_log(path: Path) -> LogCounts:
    """Count the allocation-failure lines of a server log; one line naming the file when
    it cannot be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise InvalidInputError(f"cannot read server log {path}: "
                                f"{exc.strerror or exc}") from None
    lines = text.splitlines()
    hits = [(line, match) for line in lines if (match := OOM.search(line))]
    return LogCounts(str(path), len(lines), len(hits), _excerpt(*hits[0]) if hits else None)


def _excerpt(line: str, match: re.Match[str]) -> str:
    """The match and its context: the cause is often at the end of a long line."""
    start, end = max(0, match.start() - CONTEXT_CHARS), match.end() + CONTEXT_CHARS
    return ("..." if start else "") + line[start:end].strip() + (
        "..." if end < len(line) else "")
