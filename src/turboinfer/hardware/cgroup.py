"""Container limits: the CPU quota and memory limit a cgroup puts on this process.

A container often sees every host CPU in /proc while its quota allows two; thread pools
sized from ``os.cpu_count()`` then oversubscribe and latency spikes. Both cgroup v2
(``cpu.max``) and v1 (``cpu.cfs_quota_us``) are read; nested groups take the tightest.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TypeVar

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
# cgroup v1 writes "no limit" as LONG_MAX rounded down to a page; anything this big is none.
_UNLIMITED_BYTES = 1 << 60

T = TypeVar("T", int, float)


def parse_cpu_max(text: str) -> float | None:
    """Cores' worth of CPU time from cgroup v2 ``cpu.max`` ("200000 100000" -> 2.0)."""
    quota, _, period = text.strip().partition(" ")
    if quota in ("", "max"):
        return None
    return int(quota) / int(period or "100000")


def parse_cfs_quota(quota: str, period: str) -> float | None:
    """Cores' worth of CPU time from cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``."""
    quota_us = int(quota.strip())
    return None if quota_us <= 0 else quota_us / int(period.strip())


def parse_memory_limit(text: str) -> int | None:
    """Bytes from ``memory.max`` (v2) or ``memory.limit_in_bytes`` (v1); None if unlimited."""
    text = text.strip()
    if text == "max" or not text.isdigit():
        return None
    limit = int(text)
    return None if limit >= _UNLIMITED_BYTES else limit


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """/proc/self/cgroup as controller list -> path; the v2 unified entry has key ""."""
    groups = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            groups[parts[1]] = parts[2]
    return groups


def cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The tightest CPU quota over this process's cgroup and its ancestors, in cores."""
    return _tightest(root, proc_cgroup, "cpu", _read_cpu_quota)


def memory_limit(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The tightest memory limit over this process's cgroup and its ancestors, in bytes."""
    return _tightest(root, proc_cgroup, "memory", _read_memory_limit)


def _read_cpu_quota(group: Path) -> float | None:
    if (group / "cpu.max").is_file():
        return parse_cpu_max((group / "cpu.max").read_text())
    if (group / "cpu.cfs_quota_us").is_file():
        return parse_cfs_quota((group / "cpu.cfs_quota_us").read_text(),
                               (group / "cpu.cfs_period_us").read_text())
    return None


def _read_memory_limit(group: Path) -> int | None:
    for name in ("memory.max", "memory.limit_in_bytes"):
        if (group / name).is_file():
            return parse_memory_limit((group / name).read_text())
    return None


def _tightest(root: Path, proc_cgroup: Path, controller: str,
              read: Callable[[Path], T | None]) -> T | None:
    try:
        groups = parse_proc_cgroup(proc_cgroup.read_text())
        limits = [limit for group in _group_dirs(root, groups, controller)
                  if (limit := read(group)) is not None]
    except (OSError, ValueError):
        return None  # no cgroup fs (macOS, some sandboxes), or a format we do not know
    return min(limits, default=None)


def _group_dirs(root: Path, groups: dict[str, str], controller: str) -> list[Path]:
    """This process's group directory and its ancestors, under each place it may be mounted.

    Inside a container the path in /proc/self/cgroup may be the host's, absent from the
    container's mount; the mount root itself is then the container's own group.
    """
    if (root / "cgroup.controllers").is_file():  # v2 unified hierarchy
        return _with_ancestors(root, groups.get("", "/"))
    dirs: list[Path] = []
    for names, path in groups.items():
        if controller in names.split(","):
            for mount in dict.fromkeys((root / names, root / controller)):
                dirs += _with_ancestors(mount, path)
    return dirs


def _with_ancestors(base: Path, path: str) -> list[Path]:
    relative = PurePosixPath(path.lstrip("/"))
    candidates = [base / relative, *(base / parent for parent in relative.parents)]
    return [d for d in dict.fromkeys(candidates) if d.is_dir()]
