"""Everything the rules read, gathered once: a server window, this machine over it, the
saved reports (load, bench, tune/optimize, profile), a self-run, a server log, and the
hardware.

Reports are read as the plain JSON their commands write, never through the code that
wrote them, so a report from an older version or another machine still reads.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import orjson

from turboinfer.doctor.logs import LogCounts
from turboinfer.doctor.machine import MachineWindow
from turboinfer.doctor.server import ServerWindow
from turboinfer.errors import InvalidInputError
from turboinfer.hardware import HardwareProfile

Report = dict[str, Any]

# What makes a document one kind of report: keys its command always writes.
REPORT_KEYS: dict[str, tuple[str, ...]] = {
    "load": ("runs", "scenario"),
    "bench": ("results",),
    "tune": ("variants",),        # optimize's report.json, or tune's under "optimize"
    "profile": ("overhead_share",),
}


@dataclass(frozen=True)
class Inputs:
    """One field per input a rule may need (``Rule.needs`` names these fields)."""

    hardware: HardwareProfile | None = None
    server: ServerWindow | None = None
    machine: MachineWindow | None = None
    load: Report | None = None
    bench: Report | None = None      # a saved bench report, or the self-run's
    tune: Report | None = None       # optimize's report (tune's ``optimize`` section)
    profile: Report | None = None
    log: LogCounts | None = None     # a server log's allocation-failure lines

    def present(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self) if getattr(self, f.name) is not None)


def read_report(path: Path, kind: str) -> Report:
    """A saved report of ``kind``; one line naming the file when it is not one."""
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise InvalidInputError(f"cannot read {kind} report {path}: "
                                f"{exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"{path} is not JSON: {exc}") from None
    if kind == "tune" and isinstance(doc, dict) and isinstance(doc.get("optimize"), dict):
        doc = {**doc["optimize"], "tune": {k: v for k, v in doc.items() if k != "optimize"}}
    if not isinstance(doc, dict) or any(key not in doc for key in REPORT_KEYS[kind]):
        wanted = ", ".join(REPORT_KEYS[kind])
        raise InvalidInputError(f"{path} is not a {kind} report (no {wanted})")
    return doc
