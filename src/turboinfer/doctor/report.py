"""The diagnosis for people: a table worst first, then each finding in full."""

from __future__ import annotations

from turboinfer.doctor.findings import Diagnosis
from turboinfer.output import format_table


def format_text(diagnosis: Diagnosis) -> str:
    lines = [f"{name}: {value}" for name, value in diagnosis.facts]
    findings = diagnosis.worst_first()
    if findings:
        lines += ["", format_table(("severity", "rule", "symptom"),
                                   [(f.severity.label, f.rule, f.symptom) for f in findings])]
        for f in findings:
            lines += ["", f"[{f.severity.label}] {f.rule}: {f.symptom}",
                      f"  cause:    {f.cause}", f"  evidence: {f.evidence}",
                      f"  fix:      {f.fix}"]
    else:
        lines += ["", "no findings: every rule that could be judged passed"]
    if diagnosis.skipped:
        lines += ["", "not judged here:"]
        lines += [f"  {s.rule}: {s.reason}" for s in diagnosis.skipped]
    if diagnosis.passed:
        lines += ["", f"passed: {', '.join(diagnosis.passed)}"]
    return "\n".join(lines)
