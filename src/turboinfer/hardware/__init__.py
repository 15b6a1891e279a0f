"""What this machine can do: CPU ISA and limits, memory, GPUs, installed engines.

``profile()`` probes the machine; ``recommendations()`` says what is worth trying on it;
``int8_activation_type()`` and ``has_fast_fp16()`` are the decisions the optimizer uses.
A saved ``turboinfer hw --json`` document loads back with ``HardwareProfile.from_dict``.
"""

from turboinfer.hardware.advice import (
    has_fast_bf16,
    has_fast_fp16,
    int8_activation_type,
    recommendations,
)
from turboinfer.hardware.cpu import cpu_from_text
from turboinfer.hardware.model import (
    CacheLevel,
    CacheSizes,
    CpuProfile,
    EngineProfile,
    GpuProfile,
    HardwareProfile,
    MemoryProfile,
)
from turboinfer.hardware.parsers import CpuFacts, parse_cpuinfo, parse_lscpu
from turboinfer.hardware.probe import profile

__all__ = [
    "CacheLevel",
    "CacheSizes",
    "CpuFacts",
    "CpuProfile",
    "EngineProfile",
    "GpuProfile",
    "HardwareProfile",
    "MemoryProfile",
    "cpu_from_text",
    "has_fast_bf16",
    "has_fast_fp16",
    "int8_activation_type",
    "parse_cpuinfo",
    "parse_lscpu",
    "profile",
    "recommendations",
]
