"""The machine rules on recorded /proc and /sys samples (tests/doctor/data), the clock
rule beside a real measurement of one input run again and again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from turboinfer.bench.latency import BenchConfig
from turboinfer.bench.sweep import run_bench
from turboinfer.doctor import Finding, Inputs, Skip, diagnose
from turboinfer.doctor.machine import sample, window
from turboinfer.doctor.rules import cpu, memory
from turboinfer.hardware import profile
from turboinfer.models import resolve_model

DATA = Path(__file__).parent / "data"


def _inputs(start: Path, end: Path) -> Inputs:
    machine = window(sample(start), sample(end), 10.0, end)
    return Inputs(hardware=profile(engines=False, gpus=False), machine=machine)


def test_recorded_window_reads_every_counter() -> None:
    root = DATA / "throttled-vm"
    machine = window(sample(root / "start"), sample(root / "end"), 10.0, root / "end")
    assert (machine.periods, machine.throttled_periods) == (100, 60)
    assert machine.throttled_ms == 1800.0
    assert machine.steal_share == 300 / 1800
    assert (machine.swap_in_pages, machine.swap_out_pages) == (400, 1200)
    assert machine.clocks.governor == "powersave"
    assert machine.clocks.boost is True  # intel_pstate/no_turbo 0
    assert machine.online_cpus == 2


def test_throttling_steal_pressure_and_governor_fire_with_their_numbers() -> None:
    root = DATA / "throttled-vm"
    found = {f.rule: f for f in diagnose(_inputs(root / "start", root / "end")).findings}
    assert "60 of 100 CFS periods throttled (60%)" in found["throttling"].symptom
    assert "1800 ms" in found["throttling"].evidence
    assert "intra_op_threads" in found["throttling"].fix
    assert "16.7% of CPU time stolen" in found["steal"].symptom
    assert "41.5%" in found["cpu_pressure"].evidence
    assert "18.2%" in found["memory_pressure"].evidence
    assert "1600 pages swapped" in found["memory_pressure"].evidence
    governor = found["frequency_scaling"]
    assert governor.symptom == "governor 'powersave'; cpu0 at 1200 MHz of 3500 MHz (34%)"
    assert governor.evidence == ("scaling_governor=powersave, cpu0 at 1200 MHz of 3500 MHz "
                                 "(34%), boost on")
    assert governor.fix == cpu.GOVERNOR_FIX


def test_rules_say_what_this_vm_does_not_expose() -> None:
    root = DATA / "bare-vm"
    inputs = _inputs(root, root)
    outcomes = {rule.__name__: rule(inputs) for rule in
                (cpu.frequency_scaling, cpu.throttling, cpu.cpu_pressure,
                 memory.memory_pressure)}
    assert all(isinstance(o, Skip) for o in outcomes.values()), outcomes
    assert "governor not readable" in outcomes["frequency_scaling"].reason  # type: ignore[union-attr]
    assert "cpu.stat" in outcomes["throttling"].reason  # type: ignore[union-attr]
    assert isinstance(cpu.steal(inputs), Skip)  # one sample: no CPU time passed between


def test_gpu_rules_skip_without_a_gpu() -> None:
    diagnosis = diagnose(Inputs(hardware=profile(engines=False, gpus=False)))
    assert [s.reason for s in diagnosis.skipped if s.rule == "gpu_utilisation"] == [
        "no GPU found through NVML"]
    assert not any(isinstance(f, Finding) for f in diagnosis.findings)


@pytest.fixture(scope="module")
def same_input() -> dict[str, Any]:
    """A real bench of digits-cnn at batch 1: one input tensor, run at least 200 times."""
    report = run_bench(resolve_model("builtin:digits-cnn"), BenchConfig(
        engines=("onnxruntime",), batch_sizes=(1,), min_runs=200, min_seconds=0.2))
    return {"model": "builtin:digits-cnn", "results": [r.to_dict() for r in report.results]}


def _machine(root: Path) -> Inputs:
    return _inputs(root, root)


def test_a_slow_governor_is_shown_with_the_same_inputs_measured_spread(
        same_input: dict[str, Any]) -> None:
    root = DATA / "throttled-vm"
    inputs = _inputs(root / "start", root / "end")
    row = same_input["results"][0]
    ratio = row["p99_ms"] / row["p50_ms"]
    finding = cpu.frequency_scaling(Inputs(hardware=inputs.hardware, machine=inputs.machine,
                                           bench=same_input))
    assert isinstance(finding, Finding)
    assert finding.evidence == (
        "scaling_governor=powersave, cpu0 at 1200 MHz of 3500 MHz (34%), boost on; "
        f"the same input ran {row['runs']} times (onnxruntime batch 1): "
        f"p50 {row['p50_ms']:.3f} ms, p99 {row['p99_ms']:.3f} ms ({ratio:.2f}x)")
    assert row["runs"] >= 200
    # The spread raises the severity: a scaling clock that also shows as jitter.
    assert finding.severity == (cpu.Severity.CRITICAL if ratio >= cpu.JITTER
                                else cpu.Severity.WARNING)


def test_without_cpufreq_the_spread_is_reported_but_not_blamed_on_clocks(
        same_input: dict[str, Any]) -> None:
    inputs = _machine(DATA / "bare-vm")
    outcome = cpu.frequency_scaling(Inputs(machine=inputs.machine, bench=same_input))
    assert isinstance(outcome, Skip)
    assert outcome.reason.startswith("cpufreq governor not readable here")
    assert f"the same input ran {same_input['results'][0]['runs']} times" in outcome.reason


def _rows(p50: float, p99: float) -> dict[str, Any]:
    return {"results": [
        {"engine": "onnxruntime", "batch_size": 1, "threads": 2, "runs": 400,
         "p50_ms": p50, "p99_ms": p99},
        {"engine": "onnxruntime", "batch_size": 8, "threads": 2, "runs": 90,
         "p50_ms": 8 * p50, "p99_ms": 8 * p99}]}


def test_boost_with_jitter_on_a_performance_governor() -> None:
    machine = _machine(DATA / "boost-host").machine
    assert machine is not None and machine.clocks.boost is True
    finding = cpu.frequency_scaling(Inputs(machine=machine, bench=_rows(2.0, 3.6)))
    assert isinstance(finding, Finding)
    assert finding.severity == cpu.Severity.INFO
    assert finding.symptom == "the same input's p99 is 1.80x its p50 with boost on"
    assert finding.evidence == (
        "scaling_governor=performance, cpu0 at 3500 MHz of 3500 MHz (100%), boost on; "
        "the same input ran 400 times (onnxruntime batch 1, 2 thread(s)): "
        "p50 2.000 ms, p99 3.600 ms (1.80x)")
    assert finding.fix.startswith(cpu.BOOST_FIX)
    steady = cpu.frequency_scaling(Inputs(machine=machine, bench=_rows(2.0, 2.2)))
    assert steady is None
