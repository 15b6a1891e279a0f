"""Instruction-set features that decide which precision pays, under one set of names.

The kernel spells the same capability differently per architecture (``asimddp`` on ARM is
what compilers call ``dotprod``); everything after parsing uses the canonical names here.
"""

from __future__ import annotations

from collections.abc import Iterable

# Canonical feature -> kernel flags that imply it (x86 /proc/cpuinfo "flags", ARM "Features").
FEATURES: dict[str, tuple[str, ...]] = {
    # x86: FP32 SIMD width, FP16 conversion, and the INT8/BF16 dot-product units.
    "sse4_2": ("sse4_2",),
    "avx": ("avx",),
    "avx2": ("avx2",),
    "fma": ("fma",),
    "f16c": ("f16c",),
    "avx512f": ("avx512f",),
    "avx512bw": ("avx512bw",),
    "avx512vl": ("avx512vl",),
    "avx512_vnni": ("avx512_vnni",),
    "avx_vnni": ("avx_vnni",),
    "avx512_bf16": ("avx512_bf16",),
    "avx512_fp16": ("avx512_fp16",),
    "amx_tile": ("amx_tile",),
    "amx_int8": ("amx_int8",),
    "amx_bf16": ("amx_bf16",),
    "amx_fp16": ("amx_fp16",),
    # ARM: NEON is mandatory on AArch64 but reported as asimd; dotprod/i8mm are the INT8 units.
    "neon": ("asimd", "neon"),
    "asimd": ("asimd",),
    "fp16": ("asimdhp", "fphp"),
    "dotprod": ("asimddp",),
    "i8mm": ("i8mm",),
    "bf16": ("bf16",),
    "sve": ("sve",),
    "sve2": ("sve2",),
}

# INT8 dot-product units: with them, INT8 matmuls run several times faster than FP32.
VNNI_FEATURES = ("avx512_vnni", "avx_vnni", "amx_int8")
AMX_FEATURES = ("amx_tile", "amx_int8", "amx_bf16", "amx_fp16")
ARM_INT8_FEATURES = ("dotprod", "i8mm")

# ARM "CPU implementer" codes (/proc/cpuinfo has no vendor or model name on ARM).
ARM_IMPLEMENTERS: dict[str, str] = {
    "0x41": "ARM",
    "0x42": "Broadcom",
    "0x43": "Cavium",
    "0x48": "HiSilicon",
    "0x4e": "NVIDIA",
    "0x51": "Qualcomm",
    "0x61": "Apple",
    "0xc0": "Ampere",
}

# (implementer, part) -> core name, the cores one meets in servers and boards.
ARM_PARTS: dict[tuple[str, str], str] = {
    ("0x41", "0xd03"): "Cortex-A53",
    ("0x41", "0xd08"): "Cortex-A72",
    ("0x41", "0xd0b"): "Cortex-A76",
    ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd40"): "Neoverse-V1",
    ("0x41", "0xd49"): "Neoverse-N2",
    ("0x41", "0xd4f"): "Neoverse-V2",
    ("0x41", "0xd8e"): "Neoverse-N3",
    ("0xc0", "0xac3"): "Ampere-1",
    ("0xc0", "0xac4"): "Ampere-1a",
}

X86_VENDORS: dict[str, str] = {
    "GenuineIntel": "Intel",
    "AuthenticAMD": "AMD",
    "HygonGenuine": "Hygon",
}


def canonical_features(flags: Iterable[str]) -> frozenset[str]:
    """The canonical features implied by raw kernel ``flags``."""
    present = set(flags)
    return frozenset(name for name, raw in FEATURES.items() if present.intersection(raw))


def vendor_name(raw: str) -> str:
    """A short vendor name from a CPUID vendor string or an ARM implementer code."""
    raw = raw.strip()
    return X86_VENDORS.get(raw) or ARM_IMPLEMENTERS.get(raw.lower()) or raw


def arm_core_name(implementer: str, part: str) -> str | None:
    return ARM_PARTS.get((implementer.strip().lower(), part.strip().lower()))
