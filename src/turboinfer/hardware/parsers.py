"""Pure parsers for /proc/cpuinfo, ``lscpu`` and /sys size and CPU-list formats.

They take text and return plain data, so they are tested on captured samples from
machines this one is not (tests/data/hw/). Missing facts are left out of the result
rather than guessed; the caller decides which source wins.
"""

from __future__ import annotations

import re
from typing import TypedDict

from turboinfer.hardware.isa import arm_core_name, vendor_name
from turboinfer.hardware.model import CacheLevel


class CpuFacts(TypedDict, total=False):
    model_name: str
    vendor: str
    architecture: str
    logical_cores: int
    physical_cores: int
    sockets: int
    threads_per_core: int
    caches: dict[str, CacheLevel]  # keys from model.CACHE_LEVELS
    flags: list[str]


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_INSTANCES = re.compile(r"\((\d+)\s+instances?\)")


def parse_size(text: str) -> int:
    """Bytes from "48K", "32 KiB", "1.3 MiB", "1024 KB" (binary units, as lscpu and /sys use)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a size: {text!r}")
    number, unit = match.groups()
    return round(float(number) * _UNITS[unit.upper()])


def parse_cpu_list(text: str) -> list[int]:
    """CPU ids from the kernel's list format, e.g. "0-3,8,10-11"."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def parse_cache(text: str) -> CacheLevel:
    """One lscpu cache value: "192 KiB (4 instances)" is a sum, "32K" is one instance."""
    instances_match = _INSTANCES.search(text)
    size = parse_size(_INSTANCES.sub("", text))
    if not instances_match:
        return CacheLevel(size_bytes=size)
    instances = int(instances_match.group(1))
    # lscpu prints the sum rounded to one decimal ("1.3 MiB"), so one instance is approximate.
    return CacheLevel(size_bytes=round(size / instances), instances=instances)


# ---------------------------------------------------------------------------- /proc/cpuinfo


def _blocks(text: str) -> list[dict[str, str]]:
    """The ``key : value`` blocks of /proc/cpuinfo, one per logical CPU."""
    blocks: list[dict[str, str]] = []
    for chunk in re.split(r"\n\s*\n", text):
        block = {}
        for line in chunk.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                block[key.strip()] = value.strip()
        if block:
            blocks.append(block)
    return blocks


def parse_cpuinfo(text: str) -> CpuFacts:
    """Facts from /proc/cpuinfo text (x86 or ARM)."""
    processors = [b for b in _blocks(text) if "processor" in b]
    if not processors:
        return {}
    first = processors[0]
    facts: CpuFacts = {"logical_cores": len(processors)}
    flags = first.get("flags") or first.get("Features")
    if flags is not None:
        facts["flags"] = flags.split()
    if "vendor_id" in first:
        facts.update(_x86_identity(first))
    elif "CPU implementer" in first:
        facts.update(_arm_identity(first))
    facts.update(_topology(processors))
    return facts


def _x86_identity(block: dict[str, str]) -> CpuFacts:
    facts: CpuFacts = {"vendor": vendor_name(block["vendor_id"])}
    if "model name" in block:
        facts["model_name"] = block["model name"]
    # "lm" (long mode) is how cpuinfo says the CPU runs 64-bit code.
    facts["architecture"] = "x86_64" if "lm" in block.get("flags", "").split() else "i686"
    return facts


def _arm_identity(block: dict[str, str]) -> CpuFacts:
    implementer = block["CPU implementer"]
    facts: CpuFacts = {"vendor": vendor_name(implementer)}
    name = arm_core_name(implementer, block.get("CPU part", ""))
    if name:
        facts["model_name"] = name
    if block.get("CPU architecture", "").strip() == "8":
        facts["architecture"] = "aarch64"
    return facts


def _topology(processors: list[dict[str, str]]) -> CpuFacts:
    """Cores and sockets from "physical id" / "core id", when every block has them."""
    if not all("physical id" in p and "core id" in p for p in processors):
        return {}
    cores = {(p["physical id"], p["core id"]) for p in processors}
    sockets = {p["physical id"] for p in processors}
    return {
        "physical_cores": len(cores),
        "sockets": len(sockets),
        "threads_per_core": max(1, len(processors) // len(cores)),
    }


# ------------------------------------------------------------------------------------ lscpu

_LSCPU_CACHES = {
    "L1d cache": "l1d", "L1d": "l1d",
    "L1i cache": "l1i", "L1i": "l1i",
    "L2 cache": "l2", "L2": "l2",
    "L3 cache": "l3", "L3": "l3",
}


def _lscpu_pairs(text: str) -> list[tuple[str, str]]:
    """``(key, value)`` lines in order; the tree layout's indentation and headers dropped."""
    pairs = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            pairs.append((key.strip(), value.strip()))
    return pairs


def parse_lscpu(text: str) -> CpuFacts:
    """Facts from ``lscpu`` output, flat (piped) or tree (terminal) layout, old or new."""
    pairs = _lscpu_pairs(text)
    values = dict(reversed(pairs))  # the first occurrence wins
    facts: CpuFacts = {}
    if "Model name" in values:
        facts["model_name"] = values["Model name"]
    if "Architecture" in values:
        facts["architecture"] = values["Architecture"]
    if "Vendor ID" in values:
        facts["vendor"] = vendor_name(values["Vendor ID"])
    if values.get("CPU(s)", "").isdigit():
        facts["logical_cores"] = int(values["CPU(s)"])
    if "Flags" in values:
        facts["flags"] = values["Flags"].split()
    facts.update(_lscpu_topology(pairs))
    caches = {_LSCPU_CACHES[k]: parse_cache(v) for k, v in pairs if k in _LSCPU_CACHES}
    if caches:
        facts["caches"] = caches
    return facts


def _lscpu_topology(pairs: list[tuple[str, str]]) -> CpuFacts:
    """Cores summed over every core type; hybrid and big.LITTLE CPUs list one block each.

    ARM boards without socket information say "Core(s) per cluster" and "Socket(s): -".
    """
    groups: list[list[int]] = []  # [cores per unit, units] for each core type
    for key, value in pairs:
        if key in ("Core(s) per socket", "Core(s) per cluster") and value.isdigit():
            groups.append([int(value), 0])
        elif key in ("Socket(s)", "Cluster(s)") and value.isdigit() and groups:
            groups[-1][1] = groups[-1][1] or int(value)
    facts: CpuFacts = {}
    if groups:
        facts["physical_cores"] = sum(cores * (units or 1) for cores, units in groups)
    sockets = [int(v) for k, v in pairs if k == "Socket(s)" and v.isdigit()]
    if sockets:
        facts["sockets"] = sockets[0]
    threads = [int(v) for k, v in pairs if k == "Thread(s) per core" and v.isdigit()]
    if threads:
        facts["threads_per_core"] = max(threads)
    return facts
