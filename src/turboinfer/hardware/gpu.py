"""NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``), when present.

NVML answers without creating a CUDA context, so probing costs milliseconds and no GPU
memory. Without the package or a driver there are simply no GPUs to report.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from turboinfer.hardware.model import GpuProfile

log = logging.getLogger(__name__)
T = TypeVar("T")


def import_nvml() -> Any | None:
    try:
        with warnings.catch_warnings():
            # The unofficial "pynvml" package warns on import that it is deprecated.
            warnings.simplefilter("ignore")
            return importlib.import_module("pynvml")
    except Exception:  # ImportError, or a broken install raising anything at import
        return None


SmCounts = Callable[[], dict[str, int]]


def torch_sm_counts() -> dict[str, int]:
    """SM counts by GPU UUID (no "GPU-" prefix) from torch's CUDA device properties:
    NVML's attributes call answers only on MIG-capable setups and refuses elsewhere
    (an H200 without MIG). Imports torch and creates a CUDA context: asked only when
    NVML could not say, and {} without a CUDA build of torch."""
    if importlib.util.find_spec("torch") is None:
        return {}
    import torch  # seconds to import: only when NVML left an SM count unknown

    if not torch.cuda.is_available():
        return {}
    counts = {}
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        counts[str(getattr(props, "uuid", index))] = int(props.multi_processor_count)
    return counts


def read_gpus(nvml: Any | None = None,
              sm_counts: SmCounts = torch_sm_counts) -> tuple[GpuProfile, ...]:
    """Every GPU NVML sees; ``nvml`` is the pynvml module (injected by tests), and
    ``sm_counts`` fills the SM counts NVML does not give."""
    nvml = nvml if nvml is not None else import_nvml()
    if nvml is None:
        return ()
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError: no driver, no device, library not found
        log.debug("NVML unavailable: %s", exc)
        return ()
    try:
        driver = _optional(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        cuda = _optional(lambda: _cuda_version(nvml.nvmlSystemGetCudaDriverVersion_v2()))
        count = _optional(nvml.nvmlDeviceGetCount) or 0
        gpus = [_read_gpu(nvml, i, driver, cuda) for i in range(count)]
        if any(g.sm_count is None for g in gpus):
            gpus = _fill_sm_counts(nvml, gpus, _optional(sm_counts) or {})
        return tuple(gpus)
    finally:
        _optional(nvml.nvmlShutdown)


def _fill_sm_counts(nvml: Any, gpus: list[GpuProfile],
                    counts: dict[str, int]) -> list[GpuProfile]:
    """The missing SM counts from ``counts``, matched by UUID (CUDA may number the
    GPUs in another order than NVML does)."""
    def uuid_of(index: int) -> str:
        return _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(index)))

    filled = []
    for gpu in gpus:
        uuid = _optional(functools.partial(uuid_of, gpu.index))
        sms = counts.get(uuid.removeprefix("GPU-")) if uuid else None
        filled.append(gpu if gpu.sm_count is not None or sms is None
                      else replace(gpu, sm_count=sms))
    return filled


def _read_gpu(nvml: Any, index: int, driver: str | None, cuda: str | None) -> GpuProfile:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    capability = _optional(lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle))
    return GpuProfile(
        index=index,
        name=_optional(lambda: _text(nvml.nvmlDeviceGetName(handle))) or f"GPU {index}",
        memory_total_bytes=_optional(lambda: int(nvml.nvmlDeviceGetMemoryInfo(handle).total)),
        # NVML reports SMs through the (MIG-era) attributes call; older GPUs refuse it.
        sm_count=_optional(
            lambda: int(nvml.nvmlDeviceGetAttributes_v2(handle).multiprocessorCount)),
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        max_sm_clock_mhz=_optional(
            lambda: int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))),
        max_memory_clock_mhz=_optional(
            lambda: int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM))),
        driver_version=driver,
        cuda_version=cuda,
    )


def _optional(call: Callable[[], T]) -> T | None:
    """The call's result, or None when this GPU or driver does not support the query."""
    try:
        return call()
    except Exception as exc:  # NVMLError_NotSupported and friends
        log.debug("NVML query failed: %s", exc)
        return None


def _text(value: str | bytes) -> str:
    # pynvml before 11.5 returned bytes.
    return value.decode() if isinstance(value, bytes) else value


def _cuda_version(encoded: int) -> str:
    """NVML's 12040 -> "12.4"."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


GPU_EXTRA = "pip install 'turboinfer[gpu]'"


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment. ``utilisation`` is NVML's ``utilization.gpu`` as a share:
    the part of the last sample period (1/6 s to 1 s by GPU) in which at least one kernel
    ran, the figure nvidia-smi shows as GPU-Util and ``dmon`` as "sm"."""

    index: int
    name: str
    utilisation: float           # 0..1
    memory_used_bytes: int
    memory_total_bytes: int


class GpuSampler:
    """NVML opened once, read on demand (a server's scrape, a doctor window). ``note``
    says why there is nothing to read: no package, no driver, no GPU."""

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml: Any = nvml if nvml is not None else import_nvml()
        self._gpus: list[tuple[int, Any, str]] = []
        self.note: str | None = None
        if self._nvml is None:
            self.note = f"NVML not available: nvidia-ml-py is not installed ({GPU_EXTRA})"
            return
        try:
            self._nvml.nvmlInit()
        except Exception as exc:  # NVMLError: no driver, library not found
            self.note, self._nvml = f"NVML did not start: {exc}", None
            return
        for index in range(_optional(self._nvml.nvmlDeviceGetCount) or 0):
            handle = self._query(self._nvml.nvmlDeviceGetHandleByIndex, index)
            if handle is not None:
                name = self._query(self._nvml.nvmlDeviceGetName, handle)
                self._gpus.append((index, handle, _text(name) if name else f"GPU {index}"))
        if not self._gpus:
            self.note = "NVML found no GPU"

    def sample(self) -> tuple[GpuSample, ...]:
        """Every GPU's utilisation and memory now; a GPU whose query fails is left out."""
        out = []
        for index, handle, name in self._gpus:
            rates = self._query(self._nvml.nvmlDeviceGetUtilizationRates, handle)
            memory = self._query(self._nvml.nvmlDeviceGetMemoryInfo, handle)
            if rates is not None and memory is not None:
                out.append(GpuSample(index, name, float(rates.gpu) / 100.0,
                                     int(memory.used), int(memory.total)))
        return tuple(out)

    @staticmethod
    def _query(call: Callable[[Any], Any], argument: Any) -> Any | None:
        return _optional(lambda: call(argument))
