"""Run every applicable rule over the inputs; a rule applies when any input it needs is
there. A rule that trips over a report missing a field is a skip naming the field, not
a crash: reports come from other versions and other machines."""

from __future__ import annotations

from collections.abc import Sequence

from turboinfer.doctor.findings import Diagnosis, Finding, Rule, Skip
from turboinfer.doctor.inputs import Inputs
from turboinfer.doctor.rules import RULES


def diagnose(inputs: Inputs, rules: Sequence[Rule] = RULES) -> Diagnosis:
    present = set(inputs.present())
    findings: list[Finding] = []
    skipped: list[Skip] = []
    passed: list[str] = []
    for rule in rules:
        if not rule.needs & present:
            continue
        try:
            outcome = rule.check(inputs)
        except (KeyError, TypeError, ValueError) as exc:
            outcome = Skip(rule.name, f"the input lacks what the rule reads: "
                                      f"{type(exc).__name__}: {exc}")
        if isinstance(outcome, Finding):
            findings.append(outcome)
        elif isinstance(outcome, Skip):
            skipped.append(outcome)
        else:
            passed.append(rule.name)
    return Diagnosis(tuple(findings), tuple(skipped), tuple(passed),
                     tuple(sorted(present - {"hardware"})), _facts(inputs))


def _facts(inputs: Inputs) -> tuple[tuple[str, str], ...]:
    facts: list[tuple[str, str]] = []
    if inputs.hardware is not None:
        cpu = inputs.hardware.cpu
        facts.append(("machine", f"{cpu.model_name}, {cpu.usable_cores} usable cores"))
    if inputs.server is not None:
        s = inputs.server
        facts.append(("server", f"{s.url} model {s.model}: {s.requests:g} requests "
                                f"in {s.seconds:.1f} s"))
    if inputs.machine is not None:
        facts.append(("window", f"{inputs.machine.seconds:.1f} s sampled"))
    for name in ("load", "bench", "tune", "profile"):
        report = getattr(inputs, name)
        if report is not None:
            facts.append((name, str(report.get("model", "?"))))
    return tuple(facts)
