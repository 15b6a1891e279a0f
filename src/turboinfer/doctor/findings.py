"""What a rule answers: a finding with its evidence, a skip with its reason, or nothing.

A finding never stands without numbers: ``symptom`` and ``evidence`` are measured values
written out, ``fix`` is a command or a configuration line a user can apply as written.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


class Severity(enum.IntEnum):
    """Higher is worse; reports list findings worst first."""

    INFO = 1
    WARNING = 2
    CRITICAL = 3

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    symptom: str     # what was measured, with the numbers
    cause: str       # the likely cause, in a few words
    evidence: str    # the numbers that point at the cause
    fix: str         # a command or a config line

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "severity": self.severity.label}


@dataclass(frozen=True)
class Skip:
    """A rule that could not be judged here, and why (a file not readable, no GPU)."""

    rule: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Outcome = Finding | Skip | None


@dataclass(frozen=True)
class Rule:
    """One diagnosis: ``needs`` names the inputs it reads (see ``inputs.Inputs``); a rule
    whose inputs are all absent is not run, one with some present decides for itself."""

    name: str
    needs: frozenset[str]
    check: Callable[[Any], Outcome]
    family: str = ""


@dataclass(frozen=True)
class Diagnosis:
    findings: tuple[Finding, ...]
    skipped: tuple[Skip, ...]
    passed: tuple[str, ...]          # rules that ran and found nothing wrong
    sources: tuple[str, ...]         # which inputs were there: "server", "load", ...
    facts: tuple[tuple[str, str], ...] = ()

    def worst_first(self) -> list[Finding]:
        return sorted(self.findings, key=lambda f: -f.severity)

    def to_dict(self) -> dict[str, Any]:
        return {"findings": [f.to_dict() for f in self.worst_first()],
                "skipped": [s.to_dict() for s in self.skipped],
                "passed": list(self.passed), "sources": list(self.sources),
                "facts": dict(self.facts)}
