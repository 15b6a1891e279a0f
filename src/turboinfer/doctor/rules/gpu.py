"""GPU rules, read from the server's NVML gauges over the window (turboinfer exports
them while it serves a model on a GPU and NVML sees one). They judge only a model served
on a GPU: a CPU model beside an idle GPU is skipped, not passed."""

from __future__ import annotations

from turboinfer.doctor.findings import Finding, Outcome, Rule, Severity, Skip
from turboinfer.doctor.inputs import Inputs
from turboinfer.doctor.rules.latency import MIN_REQUESTS
from turboinfer.doctor.server import GpuUse, ServerWindow

LOW_UTILISATION = 0.30     # share of the window a kernel ran, the seeds' threshold
FULL_MEMORY = 0.90         # of the GPU's memory in use at the window's peak
NO_SERVER_GPU = ("the server reports no GPU (no turboinfer_gpu_* samples on /metrics: "
                 "no model served on a GPU, or no NVML, driver or GPU on its host)")


def _server_gpus(inputs: Inputs, rule: str) -> tuple[ServerWindow, tuple[GpuUse, ...]] | Skip:
    hardware, server = inputs.hardware, inputs.server
    if server is not None:
        if server.on_gpu is False:
            return Skip(rule, f"{server.model} is served on the CPU (its instance group is "
                              "KIND_CPU): GPU use is judged for a model served on a GPU")
        return (server, server.gpus) if server.gpus else Skip(rule, NO_SERVER_GPU)
    if hardware is None or not hardware.gpus:
        return Skip(rule, "no GPU found through NVML")
    names = ", ".join(g.name for g in hardware.gpus)
    return Skip(rule, f"{names}: GPU use is judged over a server's window "
                      "(turboinfer doctor URL)")


def gpu_utilisation(inputs: Inputs) -> Outcome:
    found = _server_gpus(inputs, "gpu_utilisation")
    if isinstance(found, Skip):
        return found
    server, gpus = found
    if server.requests < MIN_REQUESTS:
        return None
    idle = [g for g in gpus if g.utilisation < LOW_UTILISATION]
    if not idle:
        return None
    worst = min(idle, key=lambda g: g.utilisation)
    batch = server.avg_batch or 1.0
    larger = max(8, 2 * server.max_batch_size)
    return Finding(
        rule="gpu_utilisation", severity=Severity.WARNING,
        symptom=f"GPU {worst.gpu} ({worst.name}) busy {worst.utilisation:.0%} of the window "
                f"while {server.model} served {server.requests / server.seconds:.0f} "
                "requests/s",
        cause="batches too small or gaps between launches: the GPU waits for work",
        evidence=f"mean SM activity {worst.utilisation:.0%} over {worst.samples} NVML "
                 f"samples; batches averaged {batch:.2f} rows (max_batch_size "
                 f"{server.max_batch_size}), {server.instances} instance(s)",
        fix=f"config.yaml: max_batch_size: {larger}, dynamic_batching: "
            f"{{max_queue_delay_ms: 2}}, instances: {server.instances + 1} (another stream)")


def gpu_memory(inputs: Inputs) -> Outcome:
    found = _server_gpus(inputs, "gpu_memory")
    if isinstance(found, Skip):
        return found
    server, gpus = found
    full = [g for g in gpus if g.memory_total_bytes > 0
            and g.memory_used_bytes / g.memory_total_bytes >= FULL_MEMORY]
    if not full:
        return None
    worst = max(full, key=lambda g: g.memory_used_bytes / g.memory_total_bytes)
    share = worst.memory_used_bytes / worst.memory_total_bytes
    half = max(1, server.max_batch_size // 2) if server.max_batch_size else None
    return Finding(
        rule="gpu_memory", severity=Severity.WARNING,
        symptom=f"GPU {worst.gpu} ({worst.name}) memory {share:.0%} full at the window's peak",
        cause="the next larger batch or another instance will fail to allocate",
        evidence=f"{worst.memory_used_bytes / 2**30:.1f} of "
                 f"{worst.memory_total_bytes / 2**30:.1f} GiB in use (NVML); "
                 f"{server.instances} instance(s), max_batch_size {server.max_batch_size}",
        fix=f"config.yaml: max_batch_size: {half or '(half the largest batch sent)'}; "
            "instances: 1")


RULES = (
    Rule("gpu_utilisation", frozenset({"hardware"}), gpu_utilisation, "gpu"),
    Rule("gpu_memory", frozenset({"hardware"}), gpu_memory, "gpu"),
)
