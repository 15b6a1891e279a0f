"""The diagnosis as one HTML page, built with the same page helpers as the tune and load
reports (plotly.js inlined, so it opens offline)."""

from __future__ import annotations

from pathlib import Path

from turboinfer.charts import bullets, cell, fields, page, table
from turboinfer.doctor.findings import Diagnosis, Severity

SEVERITY_CLASS = {Severity.CRITICAL: "bad", Severity.WARNING: "bad", Severity.INFO: ""}


def render_html(diagnosis: Diagnosis) -> str:
    findings = diagnosis.worst_first()
    rows = [[f'<td class="{SEVERITY_CLASS[f.severity]}">{f.severity.label}</td>',
             cell(f.rule), cell(f.symptom), cell(f.cause), cell(f.evidence), cell(f.fix)]
            for f in findings]
    body = ["<h1>turboinfer doctor</h1>", fields(diagnosis.facts),
            "<h2>Findings, worst first</h2>",
            table(("severity", "rule", "symptom", "cause", "evidence", "fix"), rows)
            if rows else "<p>No findings: every rule that could be judged passed.</p>"]
    if diagnosis.skipped:
        body += ["<h2>Not judged here</h2>",
                 bullets(f"{s.rule}: {s.reason}" for s in diagnosis.skipped)]
    if diagnosis.passed:
        body += ["<h2>Passed</h2>", bullets(diagnosis.passed)]
    return page("turboinfer doctor", body)


def write_html(diagnosis: Diagnosis, path: Path) -> None:
    path.write_text(render_html(diagnosis), encoding="utf-8")
