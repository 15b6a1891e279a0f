"""The CPU under the model: clocks, quota throttling, steal, pressure, contention from
other processes, thread counts."""

from __future__ import annotations

from typing import Any

from turboinfer.doctor.findings import Finding, Outcome, Rule, Severity, Skip
from turboinfer.doctor.inputs import Inputs
from turboinfer.doctor.machine import Clocks, MachineWindow

SLOW_GOVERNORS = ("powersave", "ondemand", "conservative", "schedutil")
CLOCK_SHARE = 0.8          # running below this share of the max clock
THROTTLED_SHARE = 0.05     # of CFS periods
STEAL_SHARE = 0.05         # of all CPU time
CPU_PRESSURE = 20.0        # PSI cpu "some" avg10, percent of wall time
GOVERNOR_FIX = "sudo cpupower frequency-set -g performance"
BOOST_FIX = "echo 0 | sudo tee /sys/devices/system/cpu/cpufreq/boost"
JITTER = 1.5               # p99 / p50 of one input run again and again
MIN_SAME_INPUT_RUNS = 20   # fewer runs say nothing about their spread
WAIT_PER_CPU_SECOND = 0.25  # seconds a server's threads waited for a CPU per second run
MIN_CPU_SECONDS = 0.2      # a server that ran less than this in a window says nothing


def _machine(inputs: Inputs) -> MachineWindow:
    assert inputs.machine is not None
    return inputs.machine


def same_input_spread(report: dict[str, Any] | None) -> dict[str, Any] | None:
    """The bench row that ran one input the most times at the smallest batch: bench feeds
    the same tensors to every run, so its spread is the machine's, not the data's."""
    rows = [r for r in (report or {}).get("results", [])
            if r.get("runs", 0) >= MIN_SAME_INPUT_RUNS and r.get("p50_ms", 0) > 0]
    if not rows:
        return None
    smallest = min(r["batch_size"] for r in rows)
    return max((r for r in rows if r["batch_size"] == smallest), key=lambda r: r["runs"])


def _spread_text(row: dict[str, Any]) -> str:
    threads = f", {row['threads']} thread(s)" if row.get("threads") else ""
    return (f"the same input ran {row['runs']} times ({row['engine']} batch "
            f"{row['batch_size']}{threads}): p50 {row['p50_ms']:.3f} ms, p99 "
            f"{row['p99_ms']:.3f} ms ({row['p99_ms'] / row['p50_ms']:.2f}x)")


def _clock_text(clocks: Clocks) -> str:
    cur, top = clocks.cur_khz, clocks.max_khz
    return (f"cpu0 at {cur / 1e3:.0f} MHz of {top / 1e3:.0f} MHz ({cur / top:.0%})"
            if cur and top else "clock not readable")


def _sysfs_text(clocks: Clocks) -> str:
    boost = {True: "boost on", False: "boost off", None: "boost state not exposed"}
    return f"scaling_governor={clocks.governor}, {_clock_text(clocks)}, {boost[clocks.boost]}"


def frequency_scaling(inputs: Inputs) -> Outcome:
    """Governor, clock and boost from sysfs, beside the latency spread of one input run
    many times (the self-run's or a saved bench's): a scaling clock shows as both."""
    clocks = _machine(inputs).clocks
    spread = same_input_spread(inputs.bench)
    measured = "" if spread is None else f"; {_spread_text(spread)}"
    if clocks.governor is None:
        return Skip("frequency_scaling", "cpufreq governor not readable here (no /sys/devices/"
                                         f"system/cpu/cpu0/cpufreq; usual in VMs){measured}")
    cur, top = clocks.cur_khz, clocks.max_khz
    low_clock = bool(cur and top and cur / top < CLOCK_SHARE)
    ratio = spread["p99_ms"] / spread["p50_ms"] if spread is not None else None
    jitter = ratio is not None and ratio >= JITTER
    if clocks.governor in SLOW_GOVERNORS or low_clock:
        return Finding(
            rule="frequency_scaling",
            severity=Severity.CRITICAL if jitter else Severity.WARNING,
            symptom=f"governor {clocks.governor!r}; {_clock_text(clocks)}",
            cause="the CPU clock scales with load, so the same input runs at varying speed",
            evidence=f"{_sysfs_text(clocks)}{measured}", fix=GOVERNOR_FIX)
    if clocks.boost and jitter:
        return Finding(
            rule="frequency_scaling", severity=Severity.INFO,
            symptom=f"the same input's p99 is {ratio:.2f}x its p50 with boost on",
            cause="turbo clocks follow temperature and the number of busy cores",
            evidence=f"{_sysfs_text(clocks)}{measured}",
            fix=f"{BOOST_FIX} (steady clocks, lower peak), then bench again")
    return None


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


def contention(inputs: Inputs) -> Outcome:
    """The server's own threads waiting for a CPU (schedstat, exported on /metrics): the
    direct sign of another process on its cores, where PSI is machine-wide."""
    server = inputs.server
    assert server is not None
    if server.cpu_wait_seconds is None or server.cpu_seconds is None:
        return Skip("cpu_contention", "the server exports no CPU wait "
                                      "(turboinfer_cpu_wait_seconds_total needs schedstat)")
    if server.cpu_seconds < MIN_CPU_SECONDS:
        return None
    per_second = server.cpu_wait_seconds / server.cpu_seconds
    if per_second < WAIT_PER_CPU_SECOND:
        return None
    psi = inputs.machine.psi_cpu_some if inputs.machine else None
    pressure = "" if psi is None else f"; PSI cpu some avg10 {psi:.1f}% on this machine"
    cores = "" if server.usable_cores is None else f" of {server.usable_cores:g} usable"
    return Finding(
        rule="cpu_contention",
        severity=Severity.CRITICAL if per_second >= 1.0 else Severity.WARNING,
        symptom=f"{server.model}: the server's threads waited {server.cpu_wait_seconds:.2f} s "
                f"for a CPU while running {server.cpu_seconds:.2f} s in {server.seconds:.0f} s",
        cause="other work (another process, or more threads than cores) holds the "
              "server's cores",
        evidence=f"{per_second:.2f} s runnable but waiting per CPU second (schedstat "
                 f"run-queue wait); the server used {server.cpu_cores or 0:.2f} "
                 f"cores{cores}{pressure}",
        fix="give the server cores of its own: taskset -c 1 turboinfer serve REPO (and the "
            "other work elsewhere), or config.yaml: engine_settings: {intra_op_threads: 1}")


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
    Rule("cpu_contention", frozenset({"server"}), contention, "cpu"),
    Rule("oversubscription", frozenset({"bench", "server"}), oversubscription, "cpu"),
)
