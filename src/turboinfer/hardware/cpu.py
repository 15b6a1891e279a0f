"""The CPU profile: facts from /sys, ``lscpu`` and /proc/cpuinfo, merged by trust.

/sys is exact and needs no binary; ``lscpu`` knows sockets and caches on systems whose
/sys is thin; /proc/cpuinfo has the ISA flags. Each source only fills what the ones
before it left out.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import psutil

from turboinfer.hardware import cgroup, sysfs
from turboinfer.hardware.isa import canonical_features
from turboinfer.hardware.model import CacheSizes, CpuProfile
from turboinfer.hardware.parsers import CpuFacts, parse_cpuinfo, parse_lscpu

PROC_CPUINFO = Path("/proc/cpuinfo")
LSCPU_TIMEOUT_S = 2.0


def merge_facts(*sources: CpuFacts) -> CpuFacts:
    """One set of facts; for each key the first source that has it wins."""
    merged: CpuFacts = {}
    for facts in reversed(sources):
        merged.update(facts)
    return merged


def cpu_from_facts(facts: CpuFacts, *, governor: str | None = None,
                   cgroup_cpu_limit: float | None = None,
                   affinity: tuple[int, ...] = ()) -> CpuProfile:
    flags = tuple(facts.get("flags", ()))
    logical = facts.get("logical_cores") or len(affinity) or 1
    return CpuProfile(
        model_name=facts.get("model_name", "unknown"),
        vendor=facts.get("vendor", "unknown"),
        architecture=facts.get("architecture", "unknown"),
        logical_cores=logical,
        physical_cores=facts.get("physical_cores"),
        sockets=facts.get("sockets"),
        caches=CacheSizes(**facts.get("caches", {})),
        features=canonical_features(flags),
        flags=flags,
        governor=governor,
        cgroup_cpu_limit=cgroup_cpu_limit,
        affinity=affinity,
    )


def cpu_from_text(*, cpuinfo: str | None = None, lscpu: str | None = None) -> CpuProfile:
    """A CPU profile from captured tool output alone, e.g. from another machine."""
    return cpu_from_facts(merge_facts(
        parse_lscpu(lscpu) if lscpu else {},
        parse_cpuinfo(cpuinfo) if cpuinfo else {},
    ))


def run_lscpu(timeout_s: float = LSCPU_TIMEOUT_S) -> str | None:
    """``lscpu`` output in the C locale, or None when it is missing, slow or failing."""
    exe = shutil.which("lscpu")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe], capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "LC_ALL": "C"}, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def read_cpu() -> CpuProfile:
    """This machine's CPU, and the share of it this process may use."""
    lscpu = run_lscpu()
    facts = merge_facts(
        sysfs.read_sysfs_cpu(),
        parse_lscpu(lscpu) if lscpu else {},
        _read_cpuinfo(),
        _platform_facts(),
    )
    return cpu_from_facts(
        facts,
        governor=sysfs.read_governor(),
        cgroup_cpu_limit=cgroup.cpu_limit(),
        affinity=_affinity(),
    )


def _read_cpuinfo() -> CpuFacts:
    try:
        return parse_cpuinfo(PROC_CPUINFO.read_text())
    except OSError:
        return {}


def _platform_facts() -> CpuFacts:
    """Last resort where /proc and /sys are absent (macOS, Windows)."""
    facts: CpuFacts = {"architecture": platform.machine() or "unknown",
                       "logical_cores": os.cpu_count() or 1}
    if platform.processor():
        facts["model_name"] = platform.processor()
    physical = psutil.cpu_count(logical=False)
    if physical:
        facts["physical_cores"] = physical
    return facts


def _affinity() -> tuple[int, ...]:
    # sched_getaffinity is Linux-only; elsewhere every CPU is assumed usable.
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))
