"""One call per doctor run: gather what the modes ask for, then run the rule table."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from turboinfer.doctor.diagnose import diagnose
from turboinfer.doctor.findings import Diagnosis, Skip
from turboinfer.doctor.inputs import Inputs, Report, read_report
from turboinfer.doctor.logs import LogCounts, read_log
from turboinfer.doctor.machine import MachineWindow, sample, window
from turboinfer.doctor.selfrun import SelfRunSettings, self_run
from turboinfer.doctor.server import ServerWindow, observe
from turboinfer.errors import ConfigError
from turboinfer.hardware import profile


@dataclass(frozen=True)
class DoctorRequest:
    """The modes combine: a server URL, a model to self-run, saved reports."""

    url: str | None = None
    model: str | None = None             # the served model's name (URL mode)
    window_s: float = 30.0
    self_run: str | None = None          # a model reference to bench here
    self_run_settings: SelfRunSettings = field(default_factory=SelfRunSettings)
    reports: tuple[tuple[str, Path], ...] = ()   # (kind, path)
    server_log: Path | None = None       # the server's log, read for allocation failures

    def __post_init__(self) -> None:
        if (self.url is None and self.self_run is None and not self.reports
                and self.server_log is None):
            raise ConfigError("give a server URL, a MODEL to run, a saved report "
                              "(--load, --bench, --tune, --profile) or --server-log")


def run_doctor(request: DoctorRequest) -> Diagnosis:
    reports = {kind: read_report(path, kind) for kind, path in request.reports}
    server, machine = _observe(request) if request.url else (None, None)
    bench: Report | None = reports.get("bench")
    profiled: Report | None = reports.get("profile")
    notes: tuple[str, ...] = ()
    if request.self_run is not None:
        run = self_run(request.self_run, request.self_run_settings)
        bench, machine, notes = run.bench, machine or run.machine, run.notes
        profiled = profiled or run.profile  # a saved profile was asked for by name
    log: LogCounts | None = read_log(request.server_log) if request.server_log else None
    diagnosis = diagnose(Inputs(
        hardware=profile(engines=False), server=server, machine=machine,
        load=reports.get("load"), bench=bench, tune=reports.get("tune"),
        profile=profiled, log=log))
    # A self-run whose profiler could not run says so where the profile rules would.
    skips = tuple(Skip(rule, note) for note in notes
                  for rule in ("framework_overhead", "qdq_share"))
    return replace(diagnosis, skipped=diagnosis.skipped + skips)


def _observe(request: DoctorRequest) -> tuple[ServerWindow, MachineWindow]:
    assert request.url is not None
    started, before = time.monotonic(), sample()
    server = observe(request.url, model=request.model, seconds=request.window_s)
    return server, window(before, sample(), time.monotonic() - started)
