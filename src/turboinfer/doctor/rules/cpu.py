"""The CPU under the model: clocks, quota throttling, steal, pressure, thread counts."""

from __future__ import annotations

from typing import Any

from turboinfer.doctor.findings import Finding, Outcome, Rule, Severity, Skip
from turboinfer.doctor.inputs import Inputs
from turboinfer.doctor.machine import MachineWindow

SLOW_GOVERNORS = ("powersave", "ondemand", "conservative", "schedutil")
CLOCK_SHARE = 0.8          # running below this share of the max clock
THROTTLED_SHARE = 0.05     # of CFS periods
STEAL_SHARE = 0.05         # of all CPU time
CPU_PRESSURE = 20.0        # PSI cpu "some" avg10, percent of wall time
GOVERNOR_FIX = "sudo cpupower frequency-set -g performance"


def _machine(inputs: Inputs) -> MachineWindow:
    assert inputs.machine is not None
    return inputs.machine


def frequency_scaling(inputs: Inputs) -> Outcome:
    clocks = _machine(inputs).clocks
    if clocks.governor is None:
        return Skip("frequency_scaling", "cpufreq governor not readable here "
                                         "(no /sys/devices/system/cpu/cpu0/cpufreq; usual in VMs)")
    slow = clocks.governor in SLOW_GOVERNORS
    cur, top = clocks.cur_khz, clocks.max_khz
    ratio = cur / top if cur and top else None
    if not slow and (ratio is None or ratio >= CLOCK_SHARE):
        return None
    clock = ("clock not readable" if not cur or not top or ratio is None else
             f"cpu0 at {cur / 1e3:.0f} MHz of {top / 1e3:.0f} MHz ({ratio:.0%})")
    return Finding(
        rule="frequency_scaling", severity=Severity.WARNING,
        symptom=f"governor {clocks.governor!r}; {clock}",
        cause="the CPU clock scales with load, so the same input runs at varying speed",
        evidence=f"scaling_governor={clocks.governor}, {clock}",
        fix=GOVERNOR_FIX)


def throttling(inputs: Inputs) -> Outcome:
    machine = _machine(inputs)
    if machine.periods is None or machine.throttled_periods is None:
        return Skip("throttling", "cgroup cpu.stat not readable")
    if machine.periods == 0 or machine.throttled_periods / machine.periods < THROTTLED_SHARE:
        return None
    share = machine.throttled_periods / machine.periods
    limit = inputs.hardware.cpu.cgroup_cpu_limit if inputs.hardware else None
    quota = "" if limit is None else f"; the quota is {limit:g} cores"
    threads = max(1, int(limit or 1))
    return Finding(
        rule="throttling", severity=Severity.CRITICAL if share > 0.25 else Severity.WARNING,
        symptom=f"{machine.throttled_periods} of {machine.periods} CFS periods throttled "
                f"({share:.0%}) in {machine.seconds:.0f} s",
        cause="the container's CPU quota runs out within a period and the process waits",
        evidence=f"throttled for {machine.throttled_ms or 0:.0f} ms in all{quota}",
        fix=f"config.yaml: engine_settings: {{intra_op_threads: {threads}}} "
            "(or raise the limit: docker --cpus / resources.limits.cpu)")


def steal(inputs: Inputs) -> Outcome:
    machine = _machine(inputs)
    if machine.steal_share is None:
        return Skip("steal", "/proc/stat not readable")
    if machine.steal_share < STEAL_SHARE:
        return None
    return Finding(
        rule="steal", severity=Severity.WARNING,
        symptom=f"{machine.steal_share:.1%} of CPU time stolen in {machine.seconds:.0f} s",
        cause="the hypervisor gives this VM's CPUs to other guests",
        evidence=f"steal {machine.steal_share:.1%} of all jiffies (/proc/stat)",
        fix="move to dedicated vCPUs (a non-burstable instance type), then "
            "turboinfer tune MODEL --slo-p99-ms X -o REPO again")


def cpu_pressure(inputs: Inputs) -> Outcome:
    machine = _machine(inputs)
    if machine.psi_cpu_some is None:
        return Skip("cpu_pressure", "/proc/pressure/cpu not readable (PSI off)")
    if machine.psi_cpu_some < CPU_PRESSURE:
        return None
    return Finding(
        rule="cpu_pressure", severity=Severity.WARNING,
        symptom=f"runnable tasks waited for a CPU {machine.psi_cpu_some:.0f}% of the time",
        cause="another process competes for the same cores",
        evidence=f"PSI cpu some avg10 {machine.psi_cpu_some:.1f}% "
                 f"on {machine.online_cpus} online CPUs",
        fix="config.yaml: engine_settings: {intra_op_threads: 1}, or pin the server "
            "apart: taskset -c 0 turboinfer serve REPO")


def oversubscription(inputs: Inputs) -> Outcome:
    cores = inputs.hardware.cpu.usable_cores if inputs.hardware else None
    if cores is None:
        return Skip("oversubscription", "usable cores unknown")
    if inputs.bench is not None:
        found = _bench_threads(inputs.bench, cores)
        if found is not None:
            return found
    server = inputs.server
    if server is not None and server.instances > cores:
        return Finding(
            rule="oversubscription", severity=Severity.WARNING,
            symptom=f"{server.instances} instances on {cores} usable cores",
            cause="more busy threads than cores: they take turns and stall each other",
            evidence=f"the server used {server.cpu_cores or 0:.2f} cores over the window",
            fix=f"config.yaml: instances: {cores}")
    return None


def _bench_threads(report: dict[str, Any], cores: int) -> Outcome:
    rows = [r for r in report.get("results", []) if r.get("threads")]
    if not rows:
        return None
    over = [r for r in rows if r["threads"] > cores]
    if not over:
        return None
    worst = max(over, key=lambda r: r["threads"])
    fewer = [r for r in rows if r["threads"] <= cores and r["batch_size"] == worst["batch_size"]
             and r["engine"] == worst["engine"]]
    base = min(fewer, key=lambda r: r["p99_ms"]) if fewer else None
    ratio = worst["p99_ms"] / base["p99_ms"] if base and base["p99_ms"] > 0 else None
    compare = ("" if base is None else f" against {base['p99_ms']:.2f} ms at "
               f"{base['threads']} thread(s) ({ratio:.2f}x)")
    return Finding(
        rule="oversubscription",
        severity=Severity.CRITICAL if ratio and ratio > 1.5 else Severity.WARNING,
        symptom=f"{worst['engine']} batch {worst['batch_size']}: p99 {worst['p99_ms']:.2f} ms "
                f"at {worst['threads']} intra-op threads{compare}",
        cause="more intra-op threads than usable cores",
        evidence=f"{worst['threads']} threads on {cores} usable cores (affinity and "
                 "cgroup quota)",
        fix=f"config.yaml: engine_settings: {{intra_op_threads: {cores}}}")


RULES = (
    Rule("frequency_scaling", frozenset({"machine"}), frequency_scaling, "cpu"),
    Rule("throttling", frozenset({"machine"}), throttling, "cpu"),
    Rule("steal", frozenset({"machine"}), steal, "cpu"),
    Rule("cpu_pressure", frozenset({"machine"}), cpu_pressure, "cpu"),
    Rule("oversubscription", frozenset({"bench", "server"}), oversubscription, "cpu"),
)
