"""CPU topology, caches and frequency governor from /sys/devices/system/cpu.

Needs no ``lscpu`` binary (slim containers lack util-linux), and its cache sizes are
exact per instance where lscpu rounds a sum.
"""

from __future__ import annotations

from pathlib import Path

from turboinfer.hardware.model import CacheLevel
from turboinfer.hardware.parsers import CpuFacts, parse_cpu_list, parse_size

SYS_CPU = Path("/sys/devices/system/cpu")

_CACHE_NAMES = {("1", "Data"): "l1d", ("1", "Instruction"): "l1i",
                ("2", "Unified"): "l2", ("3", "Unified"): "l3"}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def online_cpus(root: Path = SYS_CPU) -> list[int]:
    text = _read(root / "online")
    if text:
        return parse_cpu_list(text)
    return sorted(int(p.name[3:]) for p in root.glob("cpu[0-9]*"))


def read_sysfs_cpu(root: Path = SYS_CPU) -> CpuFacts:
    """Cores, sockets and caches from /sys; an empty dict where /sys is not there."""
    cpus = online_cpus(root) if root.is_dir() else []
    if not cpus:
        return {}
    facts: CpuFacts = {"logical_cores": len(cpus)}
    facts.update(_topology(root, cpus))
    caches = _caches(root, cpus)
    if caches:
        facts["caches"] = caches
    return facts


def _topology(root: Path, cpus: list[int]) -> CpuFacts:
    cores: set[tuple[str, str]] = set()
    for cpu in cpus:
        topology = root / f"cpu{cpu}" / "topology"
        package, core = _read(topology / "physical_package_id"), _read(topology / "core_id")
        if package is None or core is None:
            return {}
        cores.add((package, core))
    sockets = {package for package, _ in cores}
    return {"physical_cores": len(cores), "sockets": len(sockets),
            "threads_per_core": max(1, len(cpus) // len(cores))}


def _caches(root: Path, cpus: list[int]) -> dict[str, CacheLevel]:
    """Per-instance size from cpu0's view; instances = distinct sharing sets over all CPUs."""
    caches = {}
    for index in sorted((root / f"cpu{cpus[0]}" / "cache").glob("index[0-9]*")):
        name = _CACHE_NAMES.get((_read(index / "level") or "", _read(index / "type") or ""))
        size = _read(index / "size")
        if name is None or not size:
            continue
        shared = {_read(root / f"cpu{cpu}" / "cache" / index.name / "shared_cpu_list")
                  for cpu in cpus}
        caches[name] = CacheLevel(size_bytes=parse_size(size), instances=len(shared))
    return caches


def read_governor(root: Path = SYS_CPU) -> str | None:
    """cpu0's cpufreq governor ("performance", "powersave"...); None in most VMs."""
    return _read(root / "cpu0" / "cpufreq" / "scaling_governor") or None


def read_boost(root: Path = SYS_CPU) -> bool | None:
    """Whether the CPU may clock above its base (turbo): acpi-cpufreq's ``cpufreq/boost``,
    or intel_pstate's ``no_turbo`` (inverted). None where neither is exposed."""
    boost = _read(root / "cpufreq" / "boost")
    if boost in ("0", "1"):
        return boost == "1"
    no_turbo = _read(root / "intel_pstate" / "no_turbo")
    if no_turbo in ("0", "1"):
        return no_turbo == "0"
    return None
