"""What is worth trying on a machine, decided from its profile.

The optimizer calls ``int8_activation_type`` and ``has_fast_fp16``; ``recommendations``
turns the same facts into one line each for people. Rules are a table: each looks at the
profile and either has something to say or returns None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from turboinfer.hardware.isa import ARM_INT8_FEATURES
from turboinfer.hardware.model import CpuProfile, GpuProfile, HardwareProfile

GIB = 1 << 30
LOW_MEMORY_BYTES = 2 * GIB
TENSOR_CORES = (7, 0)  # Volta: the first GPUs where FP16 matmuls run on tensor cores
BF16_TENSOR_CORES = (8, 0)  # Ampere

Int8Activation = Literal["uint8", "int8"]
Rule = Callable[[HardwareProfile], str | None]


def is_x86(cpu: CpuProfile) -> bool:
    return cpu.architecture.lower() in ("x86_64", "amd64", "i386", "i686", "x86")


def is_arm(cpu: CpuProfile) -> bool:
    return cpu.architecture.lower() in ("aarch64", "arm64") or cpu.architecture.startswith("arm")


def int8_activation_type(profile: HardwareProfile) -> Int8Activation:
    """The activation type for static INT8 quantization on this machine.

    x86 multiplies INT8 with VPMADDUBSW / VPDPBUSD, both unsigned-by-signed: ONNX
    Runtime's x86 kernels take uint8 activations (U8S8) natively, while int8 activations
    (S8S8) leave QDQ convolutions unfused. With AVX512-VNNI and AMX present, ResNet-50
    U8S8 ran at 77 ms against 282 ms for S8S8 (benchmarks/optimize/results.json). ARM's
    dot-product units are signed-by-signed, so there the symmetric int8 default is as
    fast. The optimizer still measures both.
    """
    return "uint8" if is_x86(profile.cpu) else "int8"


def tensor_core_gpus(profile: HardwareProfile,
                     minimum: tuple[int, int] = TENSOR_CORES) -> list[GpuProfile]:
    return [g for g in profile.gpus
            if (cc := g.compute_capability_tuple) is not None and cc >= minimum]


def _engines_reach_gpu(profile: HardwareProfile) -> bool:
    """Whether some engine can use a GPU; True when engines were not probed at all."""
    return not profile.engines or any(e.installed and e.cuda for e in profile.engines)


def has_fast_fp16(profile: HardwareProfile) -> bool:
    """Whether an FP16 model can run faster than FP32 here.

    True with a tensor-core GPU an engine can reach, or on ARM cores with FP16 arithmetic
    (ONNX Runtime has NEON FP16 kernels). x86 engines convert FP16 back to FP32 (even
    with AVX512-FP16, which they do not use), so there FP16 only halves the file.
    """
    if tensor_core_gpus(profile) and _engines_reach_gpu(profile):
        return True
    return is_arm(profile.cpu) and profile.cpu.has("fp16")


def has_fast_bf16(profile: HardwareProfile) -> bool:
    """Whether BF16 compute is native: AMX/AVX512-BF16, ARM BF16, or an Ampere+ GPU."""
    if tensor_core_gpus(profile, BF16_TENSOR_CORES) and _engines_reach_gpu(profile):
        return True
    return profile.cpu.has("amx_bf16", "avx512_bf16", "bf16")


# ----------------------------------------------------------------------------------- rules


def _int8_x86(cpu: CpuProfile) -> str:
    if cpu.has("amx_int8"):
        return ("AMX-INT8 present: INT8 quantization pays; keep uint8 activations (U8S8) for "
                "ONNX Runtime, whose x86 kernels leave int8-activation convs unfused")
    if cpu.has("avx512_vnni", "avx_vnni"):
        unit = "AVX512-VNNI" if cpu.has("avx512_vnni") else "AVX-VNNI"
        return f"{unit} present: INT8 quantization pays; use uint8 activations (U8S8)"
    if cpu.has("avx2"):
        return "no VNNI: INT8 static quantization needs uint8 activations (U8S8) to pay off"
    return "no AVX2: INT8 kernels fall back to SSE; expect small INT8 gains, measure first"


def _int8_arm(cpu: CpuProfile) -> str:
    units = [name for name in ARM_INT8_FEATURES if cpu.has(name)]
    if units:
        return f"ARM {'/'.join(units)} present: INT8 with int8 activations (S8S8) is fast"
    return "no ARM dotprod: INT8 gains little over FP32 on this core; measure first"


def rule_int8(profile: HardwareProfile) -> str | None:
    if is_x86(profile.cpu):
        return _int8_x86(profile.cpu)
    if is_arm(profile.cpu):
        return _int8_arm(profile.cpu)
    return None


def rule_bf16(profile: HardwareProfile) -> str | None:
    if not profile.cpu.has("amx_bf16"):
        return None
    missing = "" if profile.engine("openvino") else " (openvino is not installed)"
    return ("AMX-BF16 present: BF16 matmuls run on AMX tiles in oneDNN engines "
            f"(OpenVINO, torch); try BF16 where accuracy allows{missing}")


def rule_fp16(profile: HardwareProfile) -> str | None:
    if not profile.gpus:
        if has_fast_fp16(profile):
            return "ARM FP16 arithmetic present: FP16 on CPU may pay; measure it against INT8"
        return "no GPU: FP16 gives no speed-up here; prefer INT8"
    gpu = profile.gpus[0]
    if tensor_core_gpus(profile):
        return f"GPU {gpu.name} (compute {gpu.compute_capability}): FP16 runs on tensor cores"
    return f"GPU {gpu.name} has no tensor cores: FP16 gains over FP32 are small"


def rule_gpu_engine(profile: HardwareProfile) -> str | None:
    ort = profile.engine("onnxruntime")
    if profile.gpus and ort is not None and not ort.cuda:
        return ("GPU present but onnxruntime has no CUDA provider: "
                "install onnxruntime-gpu to use it")
    return None


def rule_threads(profile: HardwareProfile) -> str | None:
    cpu = profile.cpu
    usable, physical = cpu.usable_cores, cpu.usable_physical_cores
    if usable <= 2:
        return (f"{usable} logical cores: use 1 model instance with intra-op threads = "
                f"physical cores ({physical}); ORT parallel execution mode does not pay")
    if physical < usable:
        return (f"SMT: set intra-op threads to {physical} physical cores, not {usable} logical; "
                "sibling threads share the vector units")
    return f"intra-op threads = {physical}; for throughput try 2+ instances splitting the cores"


def rule_cgroup(profile: HardwareProfile) -> str | None:
    cpu = profile.cpu
    limit = cpu.cgroup_cpu_limit
    if limit is None or limit >= cpu.logical_cores:
        return None
    return (f"cgroup limits CPU to {limit:g} cores (of {cpu.logical_cores} visible): "
            "size thread pools from the limit, not os.cpu_count()")


def rule_affinity(profile: HardwareProfile) -> str | None:
    cpu = profile.cpu
    allowed = len(cpu.affinity)
    if not allowed or allowed >= cpu.logical_cores:
        return None
    return f"CPU affinity allows {allowed} of {cpu.logical_cores} cores: size thread pools to it"


def rule_governor(profile: HardwareProfile) -> str | None:
    governor = profile.cpu.governor
    if governor is None or governor == "performance":
        return None
    return f"CPU governor is {governor}: latency will vary; use performance for benchmarks"


def rule_sockets(profile: HardwareProfile) -> str | None:
    sockets = profile.cpu.sockets or 1
    if sockets < 2:
        return None
    return (f"{sockets} sockets: pin one model instance per socket (numactl --cpunodebind) "
            "so weights stay in local memory")


def rule_memory(profile: HardwareProfile) -> str | None:
    memory = profile.memory
    limit = memory.cgroup_limit_bytes
    if limit is not None and limit < memory.total_bytes:
        return f"cgroup limits memory to {limit / GIB:.1f} GiB: count it per model instance"
    if memory.available_bytes < LOW_MEMORY_BYTES:
        return (f"only {memory.available_bytes / GIB:.1f} GiB memory available: "
                "prefer INT8 variants and a single instance")
    return None


RULES: tuple[Rule, ...] = (
    rule_int8, rule_bf16, rule_fp16, rule_gpu_engine,
    rule_threads, rule_cgroup, rule_affinity, rule_governor, rule_sockets, rule_memory,
)


def recommendations(profile: HardwareProfile) -> list[str]:
    """Short lines of what is worth trying on this machine, most decisive first."""
    return [line for rule in RULES if (line := rule(profile)) is not None]
