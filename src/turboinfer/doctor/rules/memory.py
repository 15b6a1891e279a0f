"""Memory: pressure stalls, swapping, latency that grows faster than the batch, and
allocations that fail."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from turboinfer.doctor.findings import Finding, Outcome, Rule, Severity, Skip
from turboinfer.doctor.inputs import Inputs

MEMORY_PRESSURE = 5.0      # PSI memory "some" avg10, percent
SUPERLINEAR = 1.3          # per-sample latency at the largest batch vs the smallest


def memory_pressure(inputs: Inputs) -> Outcome:
    machine = inputs.machine
    assert machine is not None
    swapped = None
    if machine.swap_in_pages is not None and machine.swap_out_pages is not None:
        swapped = machine.swap_in_pages + machine.swap_out_pages
    if machine.psi_memory_some is None and swapped is None:
        return Skip("memory_pressure", "neither /proc/pressure/memory nor /proc/vmstat "
                                       "readable")
    psi = machine.psi_memory_some or 0.0
    if psi < MEMORY_PRESSURE and not swapped:
        return None
    return Finding(
        rule="memory_pressure",
        severity=Severity.CRITICAL if machine.psi_memory_full else Severity.WARNING,
        symptom=f"tasks stalled on memory {psi:.1f}% of the time "
                f"(full {machine.psi_memory_full or 0:.1f}%)",
        cause="the working set does not fit: pages are reclaimed or swapped",
        evidence=f"PSI memory some avg10 {psi:.1f}%, {swapped or 0} pages swapped "
                 f"in {machine.seconds:.0f} s",
        fix="config.yaml: max_batch_size: (half the current value), or instances: 1")


def superlinear_batch(inputs: Inputs) -> Outcome:
    report = inputs.bench
    assert report is not None
    curves: dict[tuple[str, Any], list[dict[str, Any]]] = defaultdict(list)
    for row in report.get("results", []):
        curves[(row["engine"], row.get("threads"))].append(row)
    for (engine, _), rows in curves.items():
        rows.sort(key=lambda r: r["batch_size"])
        small, large = rows[0], rows[-1]
        if len(rows) < 2 or small["p50_ms"] <= 0:
            continue
        per_small = small["p50_ms"] / small["batch_size"]
        per_large = large["p50_ms"] / large["batch_size"]
        if per_large < SUPERLINEAR * per_small:
            continue
        rss = f"; peak RSS {small.get('peak_rss_mb', 0):.0f} -> " \
              f"{large.get('peak_rss_mb', 0):.0f} MB"
        return Finding(
            rule="superlinear_batch", severity=Severity.WARNING,
            symptom=f"{engine}: per-sample p50 {per_small:.3f} ms at batch "
                    f"{small['batch_size']}, {per_large:.3f} ms at batch {large['batch_size']}",
            cause="latency grows faster than the batch: caches or memory run out",
            evidence=f"{per_large / per_small:.2f}x per sample{rss}",
            fix=f"config.yaml: max_batch_size: {small['batch_size']}")
    return None


def out_of_memory(inputs: Inputs) -> Outcome:
    """Allocation failures in the server log, with the server's engine failures in the
    window beside them when a server was watched. /metrics has no out-of-memory reason
    (an engine's failure is ``backend`` whatever its cause), so the log is the evidence."""
    log, server = inputs.log, inputs.server
    if log is None:
        return Skip("out_of_memory", "allocation failures are logged, not counted in "
                                     "/metrics: give the server's log (--server-log FILE)")
    if not log.oom_lines:
        return None
    failed, current = "", None
    if server is not None:
        # An engine's allocation failure may be counted as backend or, where the server
        # blames the request's size, invalid_input: the window's reasons are all shown.
        reasons = ", ".join(f"{r}: {n:g}" for r, n in server.failure_reasons.items())
        failed = (f"; {sum(server.failure_reasons.values()):g} failed request(s) of "
                  f"{server.model} in the {server.seconds:.0f} s window"
                  + (f" ({reasons})" if reasons else ""))
        current = server.max_batch_size or None
    target = (f"{max(1, current // 2)} (halve again while allocations fail)" if current
              else "(half the largest batch sent; batching off: requests bring their own)")
    return Finding(
        rule="out_of_memory", severity=Severity.CRITICAL,
        symptom=f"{log.oom_lines} allocation-failure line(s) in {log.path} "
                f"({log.lines} lines)",
        cause="a batch needs more memory than the process can get",
        evidence=f"first: {log.first_oom!r}{failed}",
        fix=f"config.yaml: max_batch_size: {target}; instances: 1; "
            f"engine_settings: {{memory_arena: false}} returns freed memory")


RULES = (
    Rule("memory_pressure", frozenset({"machine"}), memory_pressure, "memory"),
    Rule("superlinear_batch", frozenset({"bench"}), superlinear_batch, "memory"),
    Rule("out_of_memory", frozenset({"log", "server"}), out_of_memory, "memory"),
)
