"""Per-operator time from each engine's own profiler, aggregated over many runs: the
hot operators, the time outside them (framework overhead) and the share in QDQ nodes."""

from turboinfer.profile.aggregate import Aggregate, NodeTime, OpTypeTime, aggregate
from turboinfer.profile.report import ProfileReport, format_report
from turboinfer.profile.runner import PROFILERS, run_profile
from turboinfer.profile.samples import QDQ_OP_TYPES, OpTime, ProfileSettings, RunSample

__all__ = [
    "PROFILERS",
    "QDQ_OP_TYPES",
    "Aggregate",
    "NodeTime",
    "OpTime",
    "OpTypeTime",
    "ProfileReport",
    "ProfileSettings",
    "RunSample",
    "aggregate",
    "format_report",
    "run_profile",
]
