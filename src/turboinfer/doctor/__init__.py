"""Why a deployment is slow: rules over a server's metrics, this machine's state, saved
reports (load, bench, tune, profile) and a quick self-run, each finding with its
numbers and a fix.

``inputs`` gathers, ``rules/`` judges (one module per family, one table), ``diagnose``
runs the table, ``report`` prints.
"""

from turboinfer.doctor.diagnose import diagnose
from turboinfer.doctor.findings import Diagnosis, Finding, Rule, Severity, Skip
from turboinfer.doctor.inputs import Inputs, read_report
from turboinfer.doctor.rules import RULES

__all__ = ["RULES", "Diagnosis", "Finding", "Inputs", "Rule", "Severity", "Skip",
           "diagnose", "read_report"]
