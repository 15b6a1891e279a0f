"""Decisions and recommendations for each sample machine."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from turboinfer.hardware import (
    CpuProfile,
    EngineProfile,
    GpuProfile,
    HardwareProfile,
    MemoryProfile,
    cpu_from_text,
    has_fast_bf16,
    has_fast_fp16,
    int8_activation_type,
    recommendations,
)

DATA = Path(__file__).parents[1] / "data" / "hw"
GIB = 1 << 30
MEMORY = MemoryProfile(total_bytes=32 * GIB, available_bytes=30 * GIB)
ORT_CPU = EngineProfile(name="onnxruntime", installed=True, version="1.20.0",
                        providers=("CPUExecutionProvider",), cuda=False)
ORT_CUDA = replace(ORT_CPU, providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
                   cuda=True)
H100 = GpuProfile(index=0, name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * GIB,
                  sm_count=132, compute_capability="9.0", driver_version="550.54.15",
                  cuda_version="12.4")
T4 = replace(H100, name="Tesla T4", compute_capability="7.5", sm_count=40)
P4 = replace(H100, name="Tesla P4", compute_capability="6.1", sm_count=20)


def machine(sample: str, *, gpus: tuple[GpuProfile, ...] = (),
            engines: tuple[EngineProfile, ...] = (ORT_CPU,)) -> HardwareProfile:
    cpu = cpu_from_text(cpuinfo=(DATA / f"{sample}.cpuinfo").read_text(),
                        lscpu=(DATA / f"{sample}.lscpu").read_text())
    return HardwareProfile(cpu=cpu, memory=MEMORY, gpus=gpus, engines=engines)


def avx2_only_cpu() -> CpuProfile:
    """A Haswell-to-Skylake-client class CPU: AVX2 and FMA, no VNNI."""
    return CpuProfile(model_name="Intel(R) Core(TM) i7-6700", vendor="Intel",
                      architecture="x86_64", logical_cores=8, physical_cores=4, sockets=1,
                      features=frozenset({"avx", "avx2", "fma", "f16c", "sse4_2"}))


@pytest.mark.parametrize(("sample", "activation", "fp16", "bf16", "int8_line"), [
    ("kvm-xeon-amx-2cpu", "uint8", False, True, "AMX-INT8 present"),
    ("sapphire-rapids-8cpu", "uint8", False, True, "AMX-INT8 present"),
    ("epyc-zen4-8cpu", "uint8", False, True, "AVX512-VNNI present"),
    ("graviton3-8cpu", "int8", True, True, "ARM dotprod/i8mm present"),
])
def test_sample_decisions(sample: str, activation: str, fp16: bool, bf16: bool,
                          int8_line: str) -> None:
    profile = machine(sample)
    assert int8_activation_type(profile) == activation
    assert has_fast_fp16(profile) is fp16
    assert has_fast_bf16(profile) is bf16
    assert recommendations(profile)[0].startswith(int8_line)


def test_no_vnni_needs_uint8_activations() -> None:
    profile = HardwareProfile(cpu=avx2_only_cpu(), memory=MEMORY)
    assert int8_activation_type(profile) == "uint8"
    assert not has_fast_fp16(profile)
    assert not has_fast_bf16(profile)
    lines = recommendations(profile)
    assert lines[0] == ("no VNNI: INT8 static quantization needs uint8 activations (U8S8) "
                        "to pay off")
    assert "no GPU: FP16 gives no speed-up here; prefer INT8" in lines
    assert any(line.startswith("SMT: set intra-op threads to 4 physical cores") for line in lines)


def test_two_core_machine_gets_one_instance() -> None:
    lines = recommendations(machine("kvm-xeon-amx-2cpu"))
    assert ("2 logical cores: use 1 model instance with intra-op threads = physical cores (2); "
            "ORT parallel execution mode does not pay") in lines
    assert any(line.startswith("AMX-BF16 present") and line.endswith(
        "(openvino is not installed)") for line in lines)


def test_sapphire_rapids_mentions_bf16_and_smt() -> None:
    lines = recommendations(machine("sapphire-rapids-8cpu"))
    assert any(line.startswith("AMX-BF16 present") for line in lines)
    assert any(line.startswith("SMT: set intra-op threads to 4 physical cores, not 8")
               for line in lines)


def test_epyc_has_no_amx_advice() -> None:
    lines = recommendations(machine("epyc-zen4-8cpu"))
    assert not any("AMX" in line for line in lines)
    assert any(line.startswith("intra-op threads = 8") for line in lines)


def test_graviton_fp16_is_worth_measuring() -> None:
    lines = recommendations(machine("graviton3-8cpu"))
    assert any(line.startswith("ARM FP16 arithmetic present") for line in lines)
    assert not any(line.startswith("no GPU") for line in lines)


def test_tensor_core_gpu_makes_fp16_fast() -> None:
    profile = machine("sapphire-rapids-8cpu", gpus=(H100,), engines=(ORT_CUDA,))
    assert has_fast_fp16(profile)
    assert any("FP16 runs on tensor cores" in line for line in recommendations(profile))


def test_gpu_unreachable_by_engines() -> None:
    profile = machine("sapphire-rapids-8cpu", gpus=(T4,), engines=(ORT_CPU,))
    assert not has_fast_fp16(profile)
    assert any(line.startswith("GPU present but onnxruntime has no CUDA provider")
               for line in recommendations(profile))


def test_pre_volta_gpu_has_no_fast_fp16() -> None:
    profile = machine("epyc-zen4-8cpu", gpus=(P4,), engines=(ORT_CUDA,))
    assert not has_fast_fp16(profile)
    assert any("no tensor cores" in line for line in recommendations(profile))


def test_limits_governor_and_sockets() -> None:
    base = machine("sapphire-rapids-8cpu")
    cpu = replace(base.cpu, cgroup_cpu_limit=2.0, governor="powersave", sockets=2,
                  affinity=tuple(range(8)))
    lines = recommendations(replace(base, cpu=cpu, memory=replace(
        MEMORY, cgroup_limit_bytes=4 * GIB)))
    assert cpu.usable_cores == 2
    assert any(line.startswith("cgroup limits CPU to 2 cores (of 8 visible)") for line in lines)
    assert "CPU governor is powersave: latency will vary; use performance for benchmarks" in lines
    assert any(line.startswith("2 sockets: pin one model instance per socket") for line in lines)
    assert any(line.startswith("cgroup limits memory to 4.0 GiB") for line in lines)
    assert any(line.startswith("2 logical cores: use 1 model instance") for line in lines)


def test_affinity_and_low_memory() -> None:
    base = machine("epyc-zen4-8cpu")
    profile = replace(base, cpu=replace(base.cpu, affinity=(0, 1, 2)),
                      memory=MemoryProfile(total_bytes=4 * GIB, available_bytes=GIB))
    lines = recommendations(profile)
    assert "CPU affinity allows 3 of 8 cores: size thread pools to it" in lines
    assert any(line.startswith("only 1.0 GiB memory available") for line in lines)


@pytest.mark.parametrize("sample", ["sapphire-rapids-8cpu", "graviton3-8cpu"])
def test_profile_round_trips_through_json(sample: str) -> None:
    profile = machine(sample, gpus=(H100,), engines=(ORT_CUDA,))
    data = json.loads(json.dumps(profile.to_dict()))
    assert data == profile.to_dict()
    assert HardwareProfile.from_dict(data) == profile
    assert recommendations(HardwareProfile.from_dict(data)) == recommendations(profile)
