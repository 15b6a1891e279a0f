"""This machine's state over a window: steal, cgroup throttling, pressure, swap, clocks.

Everything is read from files under one ``root`` ("/" here, a folder of recorded files in
tests), as a sample at the start of the window and one at its end; counters become the
window's deltas. A file that is not there is ``None`` and the rules say they could not
judge, which is common in VMs and containers (no cpufreq, no PSI, cgroup v1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from turboinfer.hardware.cgroup import parse_proc_cgroup
from turboinfer.hardware.sysfs import online_cpus, read_boost, read_governor


def parse_proc_stat_cpu(text: str) -> tuple[int, int] | None:
    """(all jiffies, steal jiffies) from the aggregate ``cpu`` line of /proc/stat."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu" and len(fields) > 8:
            values = [int(v) for v in fields[1:]]
            # guest and guest_nice (fields 9, 10) are already counted in user and nice.
            return sum(values[:8]), values[7]
    return None


def parse_flat(text: str) -> dict[str, int]:
    """``key value`` lines (cgroup cpu.stat, /proc/vmstat) as a dict of integers."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().lstrip("-").isdigit():
            out[key] = int(value)
    return out


def parse_psi(text: str) -> dict[str, float]:
    """/proc/pressure/* as ``some_avg10``, ``full_avg60``... (percent of wall time)."""
    out = {}
    for line in text.splitlines():
        kind, *pairs = line.split()
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key.startswith("avg"):
                out[f"{kind}_{key}"] = float(value)
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


@dataclass(frozen=True)
class MachineSample:
    cpu_jiffies: tuple[int, int] | None     # (all, steal)
    cgroup_cpu: dict[str, int] | None       # cpu.stat
    vmstat: dict[str, int] | None
    psi_cpu: dict[str, float] | None
    psi_memory: dict[str, float] | None


def cpu_stat_path(root: Path) -> Path | None:
    """This process's cgroup ``cpu.stat`` (v2, or v1's cpu controller), if readable."""
    groups = parse_proc_cgroup(_read(root / "proc/self/cgroup") or "")
    cgroup = root / "sys/fs/cgroup"
    unified = groups.get("", "/").lstrip("/")
    v1 = next((p for names, p in groups.items() if "cpu" in names.split(",")), "/")
    candidates = [cgroup / unified, cgroup]
    for mount in ("cpu,cpuacct", "cpu"):
        candidates += [cgroup / mount / v1.lstrip("/"), cgroup / mount]
    return next((c / "cpu.stat" for c in candidates if (c / "cpu.stat").is_file()), None)


def sample(root: Path = Path("/")) -> MachineSample:
    stat = _read(root / "proc/stat")
    cpu_stat = cpu_stat_path(root)
    cgroup_text = _read(cpu_stat) if cpu_stat is not None else None
    vmstat = _read(root / "proc/vmstat")
    psi_cpu, psi_memory = (_read(root / f"proc/pressure/{k}") for k in ("cpu", "memory"))
    return MachineSample(
        cpu_jiffies=parse_proc_stat_cpu(stat) if stat else None,
        cgroup_cpu=parse_flat(cgroup_text) if cgroup_text else None,
        vmstat=parse_flat(vmstat) if vmstat else None,
        psi_cpu=parse_psi(psi_cpu) if psi_cpu else None,
        psi_memory=parse_psi(psi_memory) if psi_memory else None)


@dataclass(frozen=True)
class Clocks:
    governor: str | None
    cur_khz: int | None
    max_khz: int | None
    boost: bool | None = None   # turbo allowed: the clock then follows load and heat


def read_clocks(root: Path = Path("/")) -> Clocks:
    cpus = root / "sys/devices/system/cpu"
    freq = cpus / "cpu0" / "cpufreq"

    def khz(name: str) -> int | None:
        text = _read(freq / name)
        return int(text) if text and text.strip().isdigit() else None

    return Clocks(read_governor(cpus), khz("scaling_cur_freq"),
                  khz("cpuinfo_max_freq") or khz("scaling_max_freq"), read_boost(cpus))


@dataclass(frozen=True)
class MachineWindow:
    """What the machine did between two samples; ``None`` where it could not be read."""

    seconds: float
    steal_share: float | None           # of all CPU time on this machine
    periods: int | None                 # cgroup CFS periods in the window
    throttled_periods: int | None
    throttled_ms: float | None
    swap_in_pages: int | None
    swap_out_pages: int | None
    psi_cpu_some: float | None          # avg10 at the end, percent
    psi_memory_some: float | None
    psi_memory_full: float | None
    clocks: Clocks
    online_cpus: int

    def to_dict(self) -> dict[str, object]:
        return {k: v for k, v in vars(self).items() if k != "clocks"} | vars(self.clocks)


def window(start: MachineSample, end: MachineSample, seconds: float,
           root: Path = Path("/")) -> MachineWindow:
    steal = None
    if start.cpu_jiffies and end.cpu_jiffies:
        total = end.cpu_jiffies[0] - start.cpu_jiffies[0]
        steal = (end.cpu_jiffies[1] - start.cpu_jiffies[1]) / total if total > 0 else None
    periods, throttled, throttled_ms = _throttling(start.cgroup_cpu, end.cgroup_cpu)
    swap_in, swap_out = (_delta(start.vmstat, end.vmstat, k) for k in ("pswpin", "pswpout"))
    memory = end.psi_memory or {}
    return MachineWindow(
        seconds=seconds, steal_share=steal, periods=periods, throttled_periods=throttled,
        throttled_ms=throttled_ms, swap_in_pages=swap_in, swap_out_pages=swap_out,
        psi_cpu_some=(end.psi_cpu or {}).get("some_avg10"),
        psi_memory_some=memory.get("some_avg10"), psi_memory_full=memory.get("full_avg10"),
        clocks=read_clocks(root),
        online_cpus=len(online_cpus(root / "sys/devices/system/cpu")))


def _delta(start: dict[str, int] | None, end: dict[str, int] | None, key: str) -> int | None:
    if not start or not end or key not in start or key not in end:
        return None
    return end[key] - start[key]


def _throttling(start: dict[str, int] | None, end: dict[str, int] | None
                ) -> tuple[int | None, int | None, float | None]:
    periods = _delta(start, end, "nr_periods")
    throttled = _delta(start, end, "nr_throttled")
    usec = _delta(start, end, "throttled_usec")
    if usec is None:
        ns = _delta(start, end, "throttled_time")  # cgroup v1 counts nanoseconds
        usec = None if ns is None else ns // 1000
    return periods, throttled, None if usec is None else usec / 1000
