"""GPU and engine probes with stand-in modules: a probe reports, it never raises."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from turboinfer.hardware import EngineProfile, GpuProfile
from turboinfer.hardware.engines import probe_engine
from turboinfer.hardware.gpu import read_gpus


class NVMLError(Exception):
    pass


def fake_nvml(*, init_fails: bool = False, attributes: bool = True) -> Any:
    def init() -> None:
        if init_fails:
            raise NVMLError("NVML Shared Library Not Found")

    def attributes_v2(handle: int) -> Any:
        if not attributes:
            raise NVMLError("Not Supported")
        return SimpleNamespace(multiprocessorCount=132)

    clocks = {1: 1980, 2: 2619}
    return SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        nvmlInit=init, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",  # bytes, as pynvml < 11.5 gives
        nvmlSystemGetCudaDriverVersion_v2=lambda: 12040,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=85520809984),
        nvmlDeviceGetAttributes_v2=attributes_v2,
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlDeviceGetMaxClockInfo=lambda h, kind: clocks[kind],
        nvmlDeviceGetUUID=lambda h: f"GPU-0000000{h}-aaaa-bbbb-cccc-dddddddddddd",
    )


def test_read_gpus_from_nvml() -> None:
    gpus = read_gpus(fake_nvml())
    assert gpus[1] == GpuProfile(
        index=1, name="NVIDIA H100 80GB HBM3", memory_total_bytes=85520809984, sm_count=132,
        compute_capability="9.0", max_sm_clock_mhz=1980, max_memory_clock_mhz=2619,
        driver_version="550.54.15", cuda_version="12.4")


def test_unsupported_query_leaves_field_empty() -> None:
    assert all(g.sm_count is None for g in read_gpus(fake_nvml(attributes=False),
                                                     sm_counts=dict))


def test_sm_counts_nvml_refuses_come_from_cuda_by_uuid() -> None:
    # CUDA numbers the GPUs in another order here: the UUID decides, not the index.
    counts = {"00000001-aaaa-bbbb-cccc-dddddddddddd": 132,
              "00000000-aaaa-bbbb-cccc-dddddddddddd": 114}
    gpus = read_gpus(fake_nvml(attributes=False), sm_counts=lambda: counts)
    assert [g.sm_count for g in gpus] == [114, 132]


def test_cuda_is_not_asked_when_nvml_answers() -> None:
    def never() -> dict[str, int]:
        raise AssertionError("torch was asked although NVML gave the SM count")

    assert [g.sm_count for g in read_gpus(fake_nvml(), sm_counts=never)] == [132, 132]


def test_nvml_without_driver_means_no_gpus() -> None:
    assert read_gpus(fake_nvml(init_fails=True)) == ()


def test_missing_engine_is_not_installed() -> None:
    def describe(module: Any) -> EngineProfile:
        raise AssertionError("never imported")

    assert probe_engine("ghost", "turboinfer_no_such_engine", describe) == EngineProfile(
        name="ghost", installed=False)


def test_broken_engine_is_not_installed_with_reason(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "turboinfer_broken_engine.py").write_text(
        "raise ImportError('libfoo.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    engine = probe_engine("broken", "turboinfer_broken_engine", lambda m: EngineProfile(
        name="broken", installed=True))
    assert not engine.installed
    assert engine.error == "ImportError: libfoo.so: cannot open shared object file"
    sys.modules.pop("turboinfer_broken_engine", None)


def test_failing_query_is_a_reason() -> None:
    def describe(module: Any) -> EngineProfile:
        raise RuntimeError("no devices")

    engine = probe_engine("json-engine", "json", describe)
    assert (engine.installed, engine.error) == (False, "RuntimeError: no devices")
