"""The /proc/cpuinfo and lscpu parsers on real captures and realistic samples."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from turboinfer.hardware import CacheLevel, cpu_from_text, parse_cpuinfo, parse_lscpu
from turboinfer.hardware.parsers import parse_cache, parse_cpu_list, parse_size

DATA = Path(__file__).parents[1] / "data" / "hw"
KIB, MIB = 1 << 10, 1 << 20


@dataclass(frozen=True)
class Expected:
    sample: str
    model_name: str
    vendor: str
    architecture: str
    logical: int
    physical: int
    threads_per_core: int
    caches: dict[str, CacheLevel]
    present: tuple[str, ...]
    absent: tuple[str, ...]


SAMPLES = [
    Expected(
        "kvm-xeon-amx-2cpu", "Intel(R) Xeon(R) Processor", "Intel", "x86_64", 2, 2, 1,
        {"l1d": CacheLevel(48 * KIB, 2), "l1i": CacheLevel(64 * KIB, 2),
         "l2": CacheLevel(2 * MIB, 2), "l3": CacheLevel(480 * MIB, 1)},
        ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni",
         "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"),
        ("neon", "sve", "dotprod", "i8mm"),
    ),
    Expected(
        "sapphire-rapids-8cpu", "Intel(R) Xeon(R) Platinum 8488C", "Intel", "x86_64", 8, 4, 2,
        {"l1d": CacheLevel(48 * KIB, 4), "l1i": CacheLevel(32 * KIB, 4),
         "l2": CacheLevel(2 * MIB, 4), "l3": CacheLevel(105 * MIB, 1)},
        ("avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16", "avx512_fp16"),
        ("neon", "amx_fp16"),
    ),
    Expected(
        "epyc-zen4-8cpu", "AMD EPYC 9R14", "AMD", "x86_64", 8, 8, 1,
        {"l1d": CacheLevel(32 * KIB), "l1i": CacheLevel(32 * KIB),
         "l2": CacheLevel(1 * MIB), "l3": CacheLevel(32 * MIB)},
        ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"),
        ("avx_vnni", "amx_tile", "amx_int8", "avx512_fp16"),
    ),
    Expected(
        "graviton3-8cpu", "Neoverse-V1", "ARM", "aarch64", 8, 8, 1,
        {"l1d": CacheLevel(64 * KIB, 8), "l1i": CacheLevel(64 * KIB, 8),
         "l2": CacheLevel(1 * MIB, 8), "l3": CacheLevel(32 * MIB, 1)},
        ("neon", "asimd", "sve", "dotprod", "i8mm", "bf16", "fp16"),
        ("sve2", "avx2", "avx512_vnni"),
    ),
]
IDS = [s.sample for s in SAMPLES]


def read(sample: str, tool: str) -> str:
    return (DATA / f"{sample}.{tool}").read_text()


@pytest.mark.parametrize("expected", SAMPLES, ids=IDS)
def test_lscpu(expected: Expected) -> None:
    facts = parse_lscpu(read(expected.sample, "lscpu"))
    assert facts["model_name"] == expected.model_name
    assert facts["vendor"] == expected.vendor
    assert facts["architecture"] == expected.architecture
    assert facts["logical_cores"] == expected.logical
    assert facts["physical_cores"] == expected.physical
    assert facts["threads_per_core"] == expected.threads_per_core
    assert facts["sockets"] == 1
    assert facts["caches"] == expected.caches


@pytest.mark.parametrize("expected", SAMPLES, ids=IDS)
def test_cpuinfo(expected: Expected) -> None:
    facts = parse_cpuinfo(read(expected.sample, "cpuinfo"))
    assert facts["model_name"] == expected.model_name
    assert facts["vendor"] == expected.vendor
    assert facts["architecture"] == expected.architecture
    assert facts["logical_cores"] == expected.logical
    if expected.architecture == "aarch64":
        # ARM cpuinfo has no physical id / core id: cores are left to lscpu or /sys.
        assert "physical_cores" not in facts
    else:
        assert facts["physical_cores"] == expected.physical
        assert facts["threads_per_core"] == expected.threads_per_core


@pytest.mark.parametrize("expected", SAMPLES, ids=IDS)
def test_features_agree_between_tools(expected: Expected) -> None:
    from_cpuinfo = cpu_from_text(cpuinfo=read(expected.sample, "cpuinfo"))
    from_lscpu = cpu_from_text(lscpu=read(expected.sample, "lscpu"))
    assert from_cpuinfo.features == from_lscpu.features
    assert set(expected.present) <= from_cpuinfo.features
    assert not set(expected.absent) & from_cpuinfo.features


@pytest.mark.parametrize("expected", SAMPLES, ids=IDS)
def test_cpu_from_both_tools(expected: Expected) -> None:
    cpu = cpu_from_text(cpuinfo=read(expected.sample, "cpuinfo"),
                        lscpu=read(expected.sample, "lscpu"))
    assert (cpu.logical_cores, cpu.physical_cores, cpu.sockets) == (
        expected.logical, expected.physical, 1)
    assert cpu.caches.l2 == expected.caches["l2"]
    assert cpu.usable_physical_cores == expected.physical


@pytest.mark.parametrize(("text", "size"), [
    ("48K", 48 * KIB), ("32768K", 32 * MIB), ("32 KiB", 32 * KIB), ("105 MiB", 105 * MIB),
    ("1.3 MiB", round(1.3 * MIB)), ("1024 KB", MIB), ("2 GiB", 2 << 30), ("512", 512),
])
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_parse_size_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


@pytest.mark.parametrize(("text", "level"), [
    ("32 KiB (1 instance)", CacheLevel(32 * KIB, 1)),
    ("1.3 MiB (26 instances)", CacheLevel(round(1.3 * MIB / 26), 26)),
    ("48K", CacheLevel(48 * KIB, None)),
])
def test_parse_cache(text: str, level: CacheLevel) -> None:
    assert parse_cache(text) == level


def test_parse_cpu_list() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("") == []


def test_lscpu_two_sockets() -> None:
    text = """Architecture:            x86_64
CPU(s):                  208
Model name:              Intel(R) Xeon(R) Platinum 8473C
Thread(s) per core:      2
Core(s) per socket:      52
Socket(s):               2
L1d cache:               4.9 MiB (104 instances)
L2 cache:                208 MiB (104 instances)
"""
    facts = parse_lscpu(text)
    assert (facts["physical_cores"], facts["sockets"]) == (104, 2)
    assert facts["caches"]["l2"] == CacheLevel(2 * MIB, 104)
    assert abs(facts["caches"]["l1d"].size_bytes - 48 * KIB) < KIB  # lscpu rounded the sum


def test_lscpu_big_little_clusters() -> None:
    # An RK3588 board: two core types, no socket information.
    text = """Architecture:           aarch64
CPU(s):                 8
Vendor ID:              ARM
  Model name:           Cortex-A55
    Thread(s) per core: 1
    Core(s) per cluster: 4
    Socket(s):          -
    Cluster(s):         1
  Model name:           Cortex-A76
    Thread(s) per core: 1
    Core(s) per cluster: 2
    Socket(s):          -
    Cluster(s):         2
"""
    facts = parse_lscpu(text)
    assert facts["model_name"] == "Cortex-A55"
    assert facts["physical_cores"] == 8
    assert "sockets" not in facts


@pytest.mark.parametrize("text", ["", "garbage\nwithout colons\n", "model name : x\n"])
def test_cpuinfo_without_processors_is_empty(text: str) -> None:
    assert parse_cpuinfo(text) == {}
