"""The machine rules on recorded /proc and /sys samples (tests/doctor/data)."""

from __future__ import annotations

from pathlib import Path

from turboinfer.doctor import Finding, Inputs, Skip, diagnose
from turboinfer.doctor.machine import sample, window
from turboinfer.doctor.rules import cpu, memory
from turboinfer.hardware import profile

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
    assert "1200 MHz of 3500 MHz (34%)" in governor.symptom
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
