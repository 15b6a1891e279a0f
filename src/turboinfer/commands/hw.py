"""``turboinfer hw``: what this machine can do, and what is worth trying on it."""

from __future__ import annotations

import argparse

from turboinfer.hardware import HardwareProfile, profile, recommendations
from turboinfer.hardware.model import CacheLevel
from turboinfer.output import print_json

NAME = "hw"
HELP = "show this machine's CPU, memory, GPUs and engines, and what is worth trying"

GIB = 1 << 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    machine = profile()
    advice = recommendations(machine)
    if args.json:
        print_json({**machine.to_dict(), "recommendations": advice})
    else:
        print(render(machine, advice))
    return 0


def render(machine: HardwareProfile, advice: list[str]) -> str:
    sections = [
        ("CPU", _cpu_lines(machine)),
        ("Memory", _memory_lines(machine)),
        ("GPU", _gpu_lines(machine)),
        ("Engines", _engine_lines(machine) or ["  none probed"]),
        ("Worth trying", [f"- {line}" for line in advice]),
    ]
    return "\n\n".join(f"{title}\n" + "\n".join(lines) for title, lines in sections)


def _size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} B"


def _cache(level: CacheLevel | None) -> str:
    if level is None:
        return "?"
    count = f" x{level.instances}" if level.instances else ""
    return f"{_size(level.size_bytes)}{count}"


def _cpu_lines(machine: HardwareProfile) -> list[str]:
    cpu = machine.cpu
    caches = cpu.caches
    limit = "none" if cpu.cgroup_cpu_limit is None else f"{cpu.cgroup_cpu_limit:g} cores"
    return [
        f"  model        {cpu.model_name} ({cpu.vendor}, {cpu.architecture})",
        f"  cores        {cpu.physical_cores or '?'} physical, {cpu.logical_cores} logical, "
        f"{cpu.sockets or '?'} socket(s); {cpu.usable_cores} usable",
        f"  caches       L1d {_cache(caches.l1d)}, L1i {_cache(caches.l1i)}, "
        f"L2 {_cache(caches.l2)}, L3 {_cache(caches.l3)}",
        f"  features     {' '.join(sorted(cpu.features)) or 'none known'}",
        f"  governor     {cpu.governor or 'not readable'}",
        f"  cgroup limit {limit}",
    ]


def _memory_lines(machine: HardwareProfile) -> list[str]:
    memory = machine.memory
    lines = [f"  total {memory.total_bytes / GIB:.1f} GiB, "
             f"available {memory.available_bytes / GIB:.1f} GiB"]
    if memory.cgroup_limit_bytes is not None:
        lines.append(f"  cgroup limit {memory.cgroup_limit_bytes / GIB:.1f} GiB")
    return lines


def _gpu_lines(machine: HardwareProfile) -> list[str]:
    if not machine.gpus:
        return ["  none found (NVML)"]
    return _columns([[
        f"#{g.index}", g.name,
        _size(g.memory_total_bytes) if g.memory_total_bytes else "? memory",
        f"{g.sm_count or '?'} SMs", f"compute {g.compute_capability or '?'}",
        f"{g.max_sm_clock_mhz or '?'} MHz", f"driver {g.driver_version or '?'}",
        f"CUDA {g.cuda_version or '?'}",
    ] for g in machine.gpus])


def _engine_lines(machine: HardwareProfile) -> list[str]:
    # OpenVINO versions carry a build suffix ("2026.4.1-22982-..."); the JSON keeps it.
    return _columns([[e.name, (e.version or "-").split("-")[0],
                      ", ".join(e.providers) or e.error or "not installed"]
                     for e in machine.engines])


def _columns(rows: list[list[str]]) -> list[str]:
    """Left-aligned text columns (``output.format_table`` right-aligns, for numbers)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]
