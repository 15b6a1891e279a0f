"""The model-repository entry format, shared by ``tune`` (writes) and ``serve`` (reads).

A repository is a folder of models; a model is a folder with ``config.yaml`` and numbered
version folders, each holding the model file::

    REPO/
      resnet18/
        config.yaml
        1/model.onnx
        2/model.onnx

``config.yaml`` (every key optional; unknown keys are rejected so typos are caught)::

    engine: onnxruntime          # onnxruntime | openvino | torch
    source: null                 # engine torch: the model as code, builtin:NAME or
                                 # package.module:factory, instead of a model_file in
                                 # each version folder (the folders 1/, 2/ ... may be
                                 # empty); the ONNX export that names its tensors is
                                 # made once and cached
    max_batch_size: 32           # 0: no batching, requests run as they arrive
    dynamic_batching:
      max_queue_delay_ms: 5.0    # the most the first request of a batch may wait; it
                                 # waits only while more requests are expected within
                                 # what is left of an adaptive window (the average gap
                                 # between arrivals is shorter): a wait someone joined
                                 # widens the window by 1/8 of this, one nobody joined
                                 # halves it; it opens only when a request arrives while
                                 # the previous batch still runs. A lone request never
                                 # waits.
      preferred_batch_sizes: [8, 16]
      max_queue_size: 1024       # requests beyond this are rejected at once (503)
      default_timeout_ms: null   # a request's deadline (queue and engine) if it sets none
    instances: 1                 # execution instances (threads over sessions)
    engine_settings:
      intra_op_threads: 2
      execution_mode: sequential # sequential | parallel
      graph_optimization: all    # disabled | basic | extended | all
      memory_arena: true
      spin_wait: false           # intra-op threads spin between runs (onnxruntime);
                                 # off by default: on a few cores the spinning threads
                                 # take the event loop's CPU (benchmarks/serving_server/
                                 # spin_wait.py)
      device: cpu                # cpu | cuda | tensorrt (onnxruntime's TensorRT
                                 # provider); a GPU needs torch with CUDA (engine torch)
                                 # or onnxruntime-gpu (the gpu extra)
      precision: fp32            # fp32 | tf32 | fp16 | bf16: torch (fp16/tf32 on cuda
                                 # only); onnxruntime takes fp16/bf16 on tensorrt
      channels_last: auto        # on | off | auto (torch: NHWC for 4-D image inputs;
                                 # auto turns it on for fp16/bf16 convolutions on a GPU)
      compile: none              # torch.compile at load: none | default |
                                 # reduce-overhead | max-autotune |
                                 # max-autotune-no-cudagraphs
      cuda_graphs: false         # torch: a CUDA graph per batch bucket (powers of two
                                 # up to max_batch_size), captured at load, a batch
                                 # padded to its bucket and replayed; onnxruntime: its
                                 # CUDA-graph option (fixed shapes only)
    version_policy: {latest: 1}  # or {all: true} or {specific: [1, 3]}
    model_file: model.onnx       # engine torch: a .pt2 (torch.export), a TorchScript
                                 # .pt, or a Hugging Face folder's name
    canary: null                 # or {version: 3, percent: 10}: that share of requests
                                 # naming no version goes to version 3, the rest to the
                                 # newest other served version (the policy must serve both)
    autoscaling:                 # instances added and removed while serving
      enabled: false
      min_instances: 1
      max_instances: null        # null: as many as the usable cores allow at one
                                 # intra-op thread each (cgroup quota included)
      scale_up_cpu_utilization: 0.70  # add one when the instances' busy share stays
      scale_up_window_s: 10.0         # above this for the whole window
      scale_down_rate_qps: 5.0        # remove one when the request rate stays under
      scale_down_window_s: 30.0       # this for the whole window
      cooldown_s: 30.0           # no decision for this long after a scale event
    idle_unload_s: null          # unload the model after this many seconds without a
                                 # request; the next request reloads it and waits
    max_dims: {}                 # per input, the largest size of each dynamic axis the
                                 # server accepts, e.g. {input_ids: [null, 512]} (null:
                                 # a fixed axis, the batch axis or max_dynamic_dim)
    max_dynamic_dim: 65536       # the cap on a dynamic axis max_dims leaves open (the
                                 # batch axis aside: max_batch_size holds it)
    preprocess: []               # images and text decoded in the server before batching
    postprocess: []              # labels, classes, embeddings added after it
    labels: {}                   # output -> label file (serve/prepost_config.py)

Validation happens once, here, at the edge; the rest of the code takes the frozen result.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from turboinfer.engines.base import (
    CompileMode,
    EngineSettings,
    ExecutionMode,
    GraphOptimization,
    Precision,
    Toggle,
)
from turboinfer.errors import ConfigError
from turboinfer.serve.prepost_config import Postprocess, Preprocess, resolve

CONFIG_FILE = "config.yaml"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DynamicBatching(_Strict):
    max_queue_delay_ms: float = Field(default=5.0, ge=0)
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_size: int = Field(default=1024, ge=1)
    default_timeout_ms: float | None = Field(default=None, gt=0)


class EngineSettingsConfig(_Strict):
    intra_op_threads: int = Field(default=0, ge=0)
    inter_op_threads: int = Field(default=0, ge=0)
    execution_mode: ExecutionMode = ExecutionMode.SEQUENTIAL
    graph_optimization: GraphOptimization = GraphOptimization.ALL
    memory_arena: bool = True
    # Off when serving: spinning intra-op threads starve the event loop of its cores.
    spin_wait: bool = False
    device: Literal["cpu", "cuda", "tensorrt"] = "cpu"  # engines.base.DEVICES
    precision: Precision = Precision.FP32
    channels_last: Toggle = Toggle.AUTO
    compile: CompileMode = CompileMode.NONE
    cuda_graphs: bool = False

    @model_validator(mode="after")
    def _graphs_on_a_gpu(self) -> EngineSettingsConfig:
        if self.cuda_graphs and self.device == "cpu":
            raise ValueError("cuda_graphs needs device cuda or tensorrt")
        return self

    def to_settings(self, max_batch_size: int = 0) -> EngineSettings:
        return EngineSettings(**self.model_dump(), max_batch_size=max_batch_size)

    @property
    def on_gpu(self) -> bool:
        return self.device != "cpu"


class VersionPolicy(_Strict):
    latest: int | None = Field(default=None, ge=1)
    all: bool = False
    specific: tuple[int, ...] | None = None

    @model_validator(mode="after")
    def _one_rule(self) -> VersionPolicy:
        chosen = sum([self.latest is not None, self.all, self.specific is not None])
        if chosen > 1:
            raise ValueError("give one of latest, all, specific")
        return self

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve among those on disk, newest first."""
        ordered = sorted(available, reverse=True)
        if self.all:
            return ordered
        if self.specific is not None:
            return [v for v in ordered if v in self.specific]
        return ordered[: self.latest or 1]


class Canary(_Strict):
    version: int = Field(ge=1)
    percent: float = Field(gt=0, lt=100)


class AutoscalingConfig(_Strict):
    """Per-model instance autoscaling inside one server (and the replica bounds that the
    Ray Serve and KServe deployments derive from it)."""

    enabled: bool = False
    min_instances: int = Field(default=1, ge=1)
    max_instances: int | None = Field(default=None, ge=1)  # None: the usable cores
    scale_up_cpu_utilization: float = Field(default=0.70, gt=0, le=1)
    scale_up_window_s: float = Field(default=10.0, gt=0)
    scale_down_rate_qps: float = Field(default=5.0, ge=0)
    scale_down_window_s: float = Field(default=30.0, gt=0)
    cooldown_s: float = Field(default=30.0, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingConfig:
        if self.max_instances is not None and self.max_instances < self.min_instances:
            raise ValueError(f"max_instances ({self.max_instances}) is below "
                             f"min_instances ({self.min_instances})")
        return self


class ModelConfig(_Strict):
    engine: Literal["onnxruntime", "openvino", "torch"] = "onnxruntime"
    source: str | None = None  # engine torch: builtin:NAME or package.module:factory
    max_batch_size: int = Field(default=0, ge=0)
    dynamic_batching: DynamicBatching | None = None
    instances: int = Field(default=1, ge=1)
    engine_settings: EngineSettingsConfig = EngineSettingsConfig()
    version_policy: VersionPolicy = VersionPolicy()
    model_file: str = "model.onnx"
    canary: Canary | None = None
    autoscaling: AutoscalingConfig = AutoscalingConfig()
    idle_unload_s: float | None = Field(default=None, gt=0)
    # A dynamic axis bounds what one request may make the engine allocate (an attention
    # over a 10**6-token axis, say); 400 beyond it, before the engine runs.
    max_dims: dict[str, list[Annotated[int, Field(ge=1)] | None]] = Field(
        default_factory=dict)
    max_dynamic_dim: int = Field(default=65536, ge=1)
    preprocess: tuple[Preprocess, ...] = ()
    postprocess: tuple[Postprocess, ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _source_is_torch(self) -> ModelConfig:
        if self.source is not None and self.engine != "torch":
            raise ValueError("source (a model as code) is for engine torch; other engines "
                             "read model_file")
        return self

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    def with_files_under(self, base: Path) -> ModelConfig:
        """The config with its tokenizer and label paths made absolute under ``base``."""
        pre = tuple(p.model_copy(update={"tokenizer": resolve(base, p.tokenizer)})
                    if p.kind == "text" else p for p in self.preprocess)
        labels = {name: resolve(base, file) for name, file in self.labels.items()}
        if pre == self.preprocess and labels == self.labels:
            return self
        return self.model_copy(update={"preprocess": pre, "labels": labels})


def load_config(path: Path) -> ModelConfig:
    """Read and validate one ``config.yaml``; errors name the file and the key."""
    if not path.is_file():
        return ModelConfig()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys, got {type(data).__name__}")
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise ConfigError(f"{path}: {key}: {first['msg']}") from None


def dump_config(config: ModelConfig, path: Path) -> None:
    data = config.model_dump(mode="json", exclude_defaults=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False) if data else "{}\n")


def write_entry(repo: Path, name: str, model_file: Path, config: ModelConfig,
                version: int | None = None) -> Path:
    """Add ``model_file`` as a version of ``name`` in ``repo`` (next number by default)
    and write the config. Returns the version folder. The file is copied in and moved
    into place last, so a poller never sees a half-written version."""

    def fill(staging: Path) -> ModelConfig:
        entry = config
        stored = Path(entry.model_file).with_suffix(model_file.suffix)
        if stored.name != entry.model_file:  # the file keeps its format's suffix
            entry = entry.model_copy(update={"model_file": stored.name})
        shutil.copyfile(model_file, staging / entry.model_file)
        for extra in model_file.parent.glob(model_file.name + ".data"):
            shutil.copyfile(extra, staging / extra.name)
        if model_file.suffix == ".xml":  # OpenVINO IR: the weights sit beside, same stem
            shutil.copyfile(model_file.with_suffix(".bin"), staging / stored.with_suffix(".bin"))
        return entry

    return _add_version(repo / name, version, fill)


def write_source_entry(repo: Path, name: str, config: ModelConfig,
                       version: int | None = None) -> Path:
    """A model as code (``config.source``, engine torch) as a version of ``name``: the
    config and an empty version folder, made under a hidden name and renamed last, as
    ``write_entry`` does. Returns the version folder."""
    if config.source is None:
        raise ConfigError("an entry without a model file needs source: (engine torch)")
    return _add_version(repo / name, version, lambda staging: config)


def _add_version(model_dir: Path, version: int | None,
                 fill: Callable[[Path], ModelConfig]) -> Path:
    """A version folder filled by ``fill`` (which returns the config to write) under a
    hidden name, then renamed into place (next number when ``version`` is None)."""
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        existing = [int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()]
        number = version if version is not None else max(existing, default=0) + 1
        final = model_dir / str(number)
        staging = Path(tempfile.mkdtemp(prefix=f".{number}-", dir=model_dir))
        dump_config(fill(staging), model_dir / CONFIG_FILE)
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    except OSError as exc:
        raise ConfigError(f"cannot write repository entry {model_dir}: {exc.strerror}") from None
    return final
