"""``profile()``: this machine, as one ``HardwareProfile``."""

from __future__ import annotations

import platform
import sys

import psutil

from turboinfer.hardware import cgroup
from turboinfer.hardware.cpu import read_cpu
from turboinfer.hardware.engines import read_engines
from turboinfer.hardware.gpu import read_gpus
from turboinfer.hardware.model import HardwareProfile, MemoryProfile


def read_memory() -> MemoryProfile:
    memory = psutil.virtual_memory()
    return MemoryProfile(total_bytes=int(memory.total), available_bytes=int(memory.available),
                         cgroup_limit_bytes=cgroup.memory_limit())


def profile(*, engines: bool = True, gpus: bool = True) -> HardwareProfile:
    """Probe CPU, memory, GPUs and engines. Never raises for a missing tool or package.

    ``engines=False`` skips importing the engines (importing torch takes about a second).
    """
    return HardwareProfile(
        cpu=read_cpu(),
        memory=read_memory(),
        gpus=read_gpus() if gpus else (),
        engines=read_engines() if engines else (),
        platform=platform.platform(),
        python=sys.version.split()[0],
    )
