"""The device axis of tune: which devices are searched, and in which forms (placements)
each engine runs a variant there.

- **cpu**: every engine runs the variant files it can (``settings.ENGINE_VARIANTS``). The
  torch engine runs the model's own module in FP32 and, when ``--engines`` names torch (or
  the CPU computes BF16 natively), also in BF16 and with channels_last for image inputs:
  forms that run on any CPU, so the search over torch forms is tested without a GPU.
- **cuda**: the torch engine runs the module in TF32, FP16 and BF16 (channels_last where
  cuDNN's tensor-core convolutions want it: ``channels_last: auto``), replayed through a
  CUDA graph per batch bucket; ONNX Runtime runs the float files on its CUDA provider and,
  with the TensorRT provider, the FP32 file in FP16 and the QDQ INT8 file. Each form is
  judged under the accuracy budget on the device, as INT8 is, and timed with CUDA events.

A placement is what a repository entry's ``engine_settings`` says about where and how a
model runs; ``Placement.entry_settings`` writes it, ``Placement.engine_settings`` loads it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turboinfer.engines import EngineSettings, Precision, TensorSpec, Toggle
from turboinfer.errors import ConfigError
from turboinfer.models import ResolvedModel
from turboinfer.models.refs import BUILTIN, is_factory, is_source
from turboinfer.models.zoo import shipped
from turboinfer.optimize.settings import TUNE_DEVICES, Variant

# The order in which devices rank as simpler between candidates within noise.
DEVICE_ORDER = ("cpu", "cuda", "tensorrt")
# ONNX Runtime's execution providers that put a candidate on a GPU, by device.
ORT_PROVIDERS = {"cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}


@dataclass(frozen=True)
class Placement:
    """Where a candidate runs and in which form: ``engine_settings`` of the entry."""

    device: str = "cpu"  # EngineSettings.device: cpu | cuda | tensorrt (ORT's provider)
    precision: Precision = Precision.FP32
    channels_last: Toggle = Toggle.AUTO
    cuda_graphs: bool = False

    @property
    def plain(self) -> bool:
        return self == Placement()

    @property
    def tag(self) -> str:
        """A short name for labels: "" for the plain CPU placement, else e.g.
        ``cuda-fp16-cl-graphs``."""
        parts = [] if self.device == "cpu" else [self.device]
        if self.precision is not Precision.FP32:
            parts.append(self.precision.value)
        if self.channels_last is Toggle.ON:
            parts.append("cl")
        if self.cuda_graphs:
            parts.append("graphs")
        return "-".join(parts) if parts else ("" if self.device == "cpu" else self.device)

    def engine_settings(self, threads: int, max_batch_size: int) -> EngineSettings:
        return EngineSettings(intra_op_threads=threads, device=self.device,
                              precision=self.precision, channels_last=self.channels_last,
                              cuda_graphs=self.cuda_graphs, max_batch_size=max_batch_size)

    def entry_settings(self) -> dict[str, Any]:
        """The ``engine_settings`` keys of a repository entry that differ from the
        defaults (``serve.config.EngineSettingsConfig``)."""
        fields: dict[str, Any] = {}
        if self.device != "cpu":
            fields["device"] = self.device
        if self.precision is not Precision.FP32:
            fields["precision"] = self.precision
        if self.channels_last is not Toggle.AUTO:
            fields["channels_last"] = self.channels_last
        if self.cuda_graphs:
            fields["cuda_graphs"] = True
        return fields

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "precision": self.precision.value,
                "channels_last": self.channels_last.value, "cuda_graphs": self.cuda_graphs}


CPU = Placement()


def cuda_available() -> bool:
    """Whether torch is installed and sees a GPU (imports torch: about a second)."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch  # optional for tune, and a second to import: only when asked

    return bool(torch.cuda.is_available())


def resolve_devices(asked: tuple[str, ...]) -> tuple[str, ...]:
    """The devices to search: ``()`` is auto (cpu, and cuda when torch sees a GPU); cuda
    asked for where there is none is a ConfigError, before any slow work."""
    if not asked:
        return ("cpu", "cuda") if cuda_available() else ("cpu",)
    if "cuda" in asked and not cuda_available():
        version = _torch_version()
        raise ConfigError(f"--devices cuda: {version} sees no GPU on this machine; search "
                          "the CPU with --devices cpu (or leave --devices at auto)")
    return tuple(d for d in TUNE_DEVICES if d in asked)


def _torch_version() -> str:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed and"
    import torch  # installed: found above

    return f"this torch ({torch.__version__})"


def ort_gpu_devices() -> tuple[str, ...]:
    """The GPU devices ONNX Runtime can run here (its CUDA and TensorRT providers come
    with onnxruntime-gpu, the ``gpu`` extra)."""
    import onnxruntime as ort  # a core dependency, but loaded only when a GPU is searched

    have = set(ort.get_available_providers())
    return tuple(device for device, provider in ORT_PROVIDERS.items() if provider in have)


@dataclass(frozen=True)
class Search:
    """What the enumeration of placements needs to know, decided once per tune."""

    devices: tuple[str, ...]
    torch_named: bool  # --engines names torch: its CPU forms are all searched
    fast_bf16: bool  # the CPU computes BF16 natively (AMX, AVX512-BF16)
    ort_gpu: tuple[str, ...] = ()  # ONNX Runtime's GPU devices here

    def notes(self, torch_source: bool) -> list[str]:
        """Why a GPU candidate the user may expect is not in the table."""
        if "cuda" not in self.devices:
            return []
        notes = []
        if "cuda" not in self.ort_gpu:
            notes.append("onnxruntime has no CUDA provider here, so its GPU candidates are "
                         "left out: pip install 'turboinfer[gpu]' adds them")
        if not torch_source:
            notes.append("the torch engine's GPU candidates need the model's PyTorch source "
                         "(builtin:NAME, package.module:factory, a .pt/.pt2 file or a "
                         "Hugging Face folder); an ONNX file runs on the GPU through "
                         "onnxruntime only")
        return notes


# Which variant files an engine runs on a GPU device: ORT's CUDA provider the float files
# (its INT8 kernels are few and slow); TensorRT also the QDQ INT8 file, on tensor cores.
GPU_VARIANTS: dict[tuple[str, str], frozenset[Variant]] = {
    ("torch", "cuda"): frozenset({Variant.FP32}),
    ("onnxruntime", "cuda"): frozenset({Variant.FP32, Variant.GRAPH, Variant.FP16}),
    ("onnxruntime", "tensorrt"): frozenset({Variant.FP32, Variant.INT8_STATIC}),
}


def placements(engine: str, variant: Variant, search: Search, specs: list[TensorSpec],
               torch_source: bool) -> Iterator[Placement]:
    """Every placement of ``variant`` on ``engine`` over the searched devices."""
    if "cpu" in search.devices:
        yield CPU
        if engine == "torch" and torch_source:
            yield from _torch_cpu_forms(search, specs)
    if "cuda" not in search.devices:
        return
    if engine == "torch" and torch_source and variant in GPU_VARIANTS[("torch", "cuda")]:
        graphs = graphable(specs)
        for precision in (Precision.TF32, Precision.FP16, Precision.BF16):
            yield Placement("cuda", precision, Toggle.AUTO, graphs)
    if engine == "onnxruntime":
        if "cuda" in search.ort_gpu and variant in GPU_VARIANTS[("onnxruntime", "cuda")]:
            yield Placement("cuda")
        if "tensorrt" in search.ort_gpu and variant in GPU_VARIANTS[("onnxruntime",
                                                                     "tensorrt")]:
            # FP16 on tensor cores for the float file; the INT8 file as it is quantized.
            fp16 = variant is Variant.FP32
            yield Placement("tensorrt", Precision.FP16 if fp16 else Precision.FP32)


def _torch_cpu_forms(search: Search, specs: list[TensorSpec]) -> Iterator[Placement]:
    image = any(_image(s) for s in specs)
    if search.torch_named or search.fast_bf16:
        yield Placement(precision=Precision.BF16)
    if search.torch_named and image:
        yield Placement(channels_last=Toggle.ON)
        yield Placement(precision=Precision.BF16, channels_last=Toggle.ON)


def graphable(specs: list[TensorSpec]) -> bool:
    """CUDA graphs need every axis but the batch axis fixed (one graph per bucket)."""
    return all(all(isinstance(d, int) for d in s.shape[1:]) for s in specs)


def _image(spec: TensorSpec) -> bool:
    return len(spec.shape) == 4 and spec.dtype.kind == "f"


def torch_source(model: object, resolved: ResolvedModel) -> str | None:
    """What a torch entry names as its ``source``, so that the server builds the same
    module: ``builtin:NAME`` for a shipped built-in, the factory as typed, the absolute
    path of a torch file or Hugging Face folder. None when the model has no PyTorch
    source the server can rebuild (an ONNX file, a test's own zoo entry)."""
    if resolved.artifact.torch_module is None:
        return None
    if resolved.entry is not None:
        return f"{BUILTIN}{resolved.entry.name}" if shipped(resolved.entry.name) else None
    if isinstance(model, str | Path) and is_source(str(model)):
        ref = str(model)
        return ref if is_factory(ref) else str(Path(ref).expanduser().resolve())
    return None
