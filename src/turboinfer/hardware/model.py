"""The hardware profile: frozen records, and their JSON form (``to_dict`` / ``from_dict``).

Later stages (tune, doctor) read a saved ``turboinfer hw --json`` document, so every
record round-trips through plain dicts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

CACHE_LEVELS = ("l1d", "l1i", "l2", "l3")


@dataclass(frozen=True)
class CacheLevel:
    """One cache level: the size of one instance (what a kernel tile must fit in)."""

    size_bytes: int
    instances: int | None = None  # None when the source only gave a per-instance size

    @property
    def total_bytes(self) -> int:
        return self.size_bytes * (self.instances or 1)


@dataclass(frozen=True)
class CacheSizes:
    l1d: CacheLevel | None = None
    l1i: CacheLevel | None = None
    l2: CacheLevel | None = None
    l3: CacheLevel | None = None


@dataclass(frozen=True)
class CpuProfile:
    """What the CPU offers and how much of it this process may use."""

    model_name: str
    vendor: str
    architecture: str
    logical_cores: int
    physical_cores: int | None = None
    sockets: int | None = None
    caches: CacheSizes = CacheSizes()
    features: frozenset[str] = frozenset()  # canonical names, see ``isa.FEATURES``
    flags: tuple[str, ...] = ()  # raw kernel flags, for anything ``features`` leaves out
    governor: str | None = None
    cgroup_cpu_limit: float | None = None  # cores' worth of CPU time, from cpu.max
    affinity: tuple[int, ...] = ()

    @property
    def usable_cores(self) -> int:
        """Logical cores this process can keep busy: affinity capped by the cgroup quota."""
        usable = len(self.affinity) or self.logical_cores
        if self.cgroup_cpu_limit is not None:
            usable = min(usable, max(1, math.ceil(self.cgroup_cpu_limit)))
        return usable

    @property
    def usable_physical_cores(self) -> int:
        """Cores worth one compute thread each: SMT siblings share the vector units."""
        threads_per_core = max(1, self.logical_cores // (self.physical_cores or self.logical_cores))
        return max(1, self.usable_cores // threads_per_core)

    def has(self, *names: str) -> bool:
        """True when any of the canonical feature ``names`` is present."""
        return any(name in self.features for name in names)


@dataclass(frozen=True)
class MemoryProfile:
    total_bytes: int
    available_bytes: int
    cgroup_limit_bytes: int | None = None


@dataclass(frozen=True)
class GpuProfile:
    index: int
    name: str
    memory_total_bytes: int | None = None
    sm_count: int | None = None
    compute_capability: str | None = None  # "8.0", "9.0"
    max_sm_clock_mhz: int | None = None
    max_memory_clock_mhz: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None  # newest CUDA the driver supports

    @property
    def compute_capability_tuple(self) -> tuple[int, int] | None:
        if not self.compute_capability:
            return None
        major, _, minor = self.compute_capability.partition(".")
        return int(major), int(minor or 0)


@dataclass(frozen=True)
class EngineProfile:
    """An inference engine as found in this Python environment."""

    name: str
    installed: bool
    version: str | None = None
    providers: tuple[str, ...] = ()  # ORT execution providers, OpenVINO devices
    cuda: bool | None = None  # whether the engine itself can reach a GPU
    error: str | None = None  # why an installed package failed to import


@dataclass(frozen=True)
class HardwareProfile:
    cpu: CpuProfile
    memory: MemoryProfile
    gpus: tuple[GpuProfile, ...] = ()
    engines: tuple[EngineProfile, ...] = ()
    platform: str = ""
    python: str = ""

    def engine(self, name: str) -> EngineProfile | None:
        return next((e for e in self.engines if e.name == name and e.installed), None)

    def summary(self) -> dict[str, Any]:
        """A few flat facts to stamp on a report (bench, tune) so numbers name their machine."""
        return {
            "cpu": self.cpu.model_name,
            "architecture": self.cpu.architecture,
            "logical_cores": self.cpu.logical_cores,
            "physical_cores": self.cpu.physical_cores,
            "usable_cores": self.cpu.usable_cores,
            "features": sorted(self.cpu.features),
            "memory_total_bytes": self.memory.total_bytes,
            "gpus": [gpu.name for gpu in self.gpus],
            "engines": {e.name: e.version for e in self.engines if e.installed},
        }

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        cpu = data["cpu"]
        cpu["features"] = sorted(self.cpu.features)
        cpu["usable_cores"] = self.cpu.usable_cores
        cpu["usable_physical_cores"] = self.cpu.usable_physical_cores
        return _lists(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HardwareProfile:
        cpu = dict(data["cpu"])
        caches = {
            level: CacheLevel(**value) if value else None
            for level, value in (cpu.get("caches") or {}).items()
            if level in CACHE_LEVELS
        }
        cpu["caches"] = CacheSizes(**caches)
        cpu["features"] = frozenset(cpu.get("features", ()))
        cpu["flags"] = tuple(cpu.get("flags", ()))
        cpu["affinity"] = tuple(cpu.get("affinity", ()))
        return cls(
            cpu=_build(CpuProfile, cpu),
            memory=_build(MemoryProfile, data["memory"]),
            gpus=tuple(_build(GpuProfile, g) for g in data.get("gpus", ())),
            engines=tuple(
                _build(EngineProfile, {**e, "providers": tuple(e.get("providers", ()))})
                for e in data.get("engines", ())
            ),
            platform=data.get("platform", ""),
            python=data.get("python", ""),
        )


def _build(cls: type[Any], data: Mapping[str, Any]) -> Any:
    """A record from a dict, ignoring derived keys (``usable_cores``) and unknown ones."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


def _lists(value: Any) -> Any:
    """Tuples to lists, recursively, so the dict compares equal to its parsed JSON."""
    if isinstance(value, dict):
        return {k: _lists(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_lists(v) for v in value]
    return value
