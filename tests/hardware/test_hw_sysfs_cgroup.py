"""/sys topology and cgroup limits, read from small fake trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from turboinfer.hardware import CacheLevel
from turboinfer.hardware.cgroup import (
    cpu_limit,
    memory_limit,
    parse_cfs_quota,
    parse_cpu_max,
    parse_memory_limit,
    parse_proc_cgroup,
)
from turboinfer.hardware.sysfs import read_governor, read_sysfs_cpu


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


@pytest.fixture
def sys_cpu(tmp_path: Path) -> Path:
    """2 sockets x 2 cores x 2 threads; siblings are CPUs n and n+4, as Linux numbers them."""
    root = tmp_path / "cpu"
    write(root / "online", "0-7")
    for cpu in range(8):
        core = cpu % 4
        write(root / f"cpu{cpu}/topology/physical_package_id", str(core // 2))
        write(root / f"cpu{cpu}/topology/core_id", str(core % 2))
        caches = [("1", "Data", "48K", str(core)), ("1", "Instruction", "32K", str(core)),
                  ("2", "Unified", "2048K", str(core)), ("3", "Unified", "107520K", str(core // 2))]
        for index, (level, kind, size, shared) in enumerate(caches):
            base = root / f"cpu{cpu}/cache/index{index}"
            write(base / "level", level)
            write(base / "type", kind)
            write(base / "size", size)
            write(base / "shared_cpu_list", f"sharing-set-{shared}")
    write(root / "cpu0/cpufreq/scaling_governor", "powersave")
    return root


def test_sysfs_topology_and_caches(sys_cpu: Path) -> None:
    facts = read_sysfs_cpu(sys_cpu)
    assert facts["logical_cores"] == 8
    assert (facts["physical_cores"], facts["sockets"], facts["threads_per_core"]) == (4, 2, 2)
    assert facts["caches"] == {
        "l1d": CacheLevel(48 << 10, 4), "l1i": CacheLevel(32 << 10, 4),
        "l2": CacheLevel(2 << 20, 4), "l3": CacheLevel(105 << 20, 2),
    }


def test_sysfs_governor(sys_cpu: Path, tmp_path: Path) -> None:
    assert read_governor(sys_cpu) == "powersave"
    assert read_governor(tmp_path / "absent") is None


def test_sysfs_absent_is_empty(tmp_path: Path) -> None:
    assert read_sysfs_cpu(tmp_path / "absent") == {}


@pytest.mark.parametrize(("text", "cores"), [
    ("max 100000\n", None), ("200000 100000\n", 2.0), ("150000 100000", 1.5), ("50000", 0.5),
])
def test_parse_cpu_max(text: str, cores: float | None) -> None:
    assert parse_cpu_max(text) == cores


def test_parse_cfs_quota() -> None:
    assert parse_cfs_quota("-1\n", "100000\n") is None
    assert parse_cfs_quota("400000\n", "100000\n") == 4.0


def test_parse_memory_limit() -> None:
    assert parse_memory_limit("max\n") is None
    assert parse_memory_limit("9223372036854771712\n") is None  # v1's "unlimited"
    assert parse_memory_limit("4294967296\n") == 4 << 30


def test_parse_proc_cgroup() -> None:
    groups = parse_proc_cgroup("4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n")
    assert groups == {"memory": "/docker/abc", "cpu,cpuacct": "/docker/abc", "": "/"}


def test_cgroup_v2_takes_tightest_ancestor(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    write(root / "cgroup.controllers", "cpu memory")
    write(root / "cpu.max", "max 100000")
    write(root / "kubepods/cpu.max", "150000 100000")
    write(root / "kubepods/pod1/cpu.max", "max 100000")
    write(root / "kubepods/pod1/memory.max", "2147483648")
    proc = tmp_path / "proc-cgroup"
    write(proc, "0::/kubepods/pod1")
    assert cpu_limit(root, proc) == 1.5
    assert memory_limit(root, proc) == 2 << 30


def test_cgroup_v1_container_sees_its_group_at_mount_root(tmp_path: Path) -> None:
    # The host path in /proc/self/cgroup does not exist inside the container's mount.
    root = tmp_path / "cgroup"
    write(root / "cpu,cpuacct/cpu.cfs_quota_us", "200000")
    write(root / "cpu,cpuacct/cpu.cfs_period_us", "100000")
    write(root / "memory/memory.limit_in_bytes", "9223372036854771712")
    proc = tmp_path / "proc-cgroup"
    write(proc, "5:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc")
    assert cpu_limit(root, proc) == 2.0
    assert memory_limit(root, proc) is None


def test_no_cgroup_fs(tmp_path: Path) -> None:
    assert cpu_limit(tmp_path / "absent", tmp_path / "absent-proc") is None
    assert memory_limit(tmp_path / "absent", tmp_path / "absent-proc") is None
