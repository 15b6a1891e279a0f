"""A served model version: its instances, its batcher, its statistics, its description.

``infer`` is the hot path between the protocol codecs and the batcher. It checks only
what would otherwise spoil a whole batch for other requests (input names, dtypes and
per-row shapes, rows within ``max_batch_size``); those are a few tuple comparisons.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from turboinfer.engines import ModelArtifact, TensorSpec
from turboinfer.engines.base import format_shape
from turboinfer.errors import ConfigError, InvalidInputError, TurboinferError, UnavailableError
from turboinfer.serve.batcher import Batcher, BatchingSettings
from turboinfer.serve.config import ModelConfig
from turboinfer.serve.instances import InstancePool, InstanceSettings
from turboinfer.serve.metrics import Metrics, VersionStats, weight_bytes
from turboinfer.serve.pipeline import Pipeline
from turboinfer.serve.protocol import InferRequest, check_requested_outputs, datatype_of

PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "openvino": "openvino",
             "torch": "pytorch_libtorch"}


def batching_settings(config: ModelConfig,
                      ragged: frozenset[str] = frozenset()) -> BatchingSettings:
    dynamic = config.dynamic_batching
    if dynamic is None:
        # Batching on without a dynamic_batching section: opportunistic batches, no wait.
        return BatchingSettings(max_batch_size=config.max_batch_size, ragged=ragged)
    timeout = dynamic.default_timeout_ms
    return BatchingSettings(
        max_batch_size=config.max_batch_size, ragged=ragged,
        max_queue_delay_s=dynamic.max_queue_delay_ms / 1000,
        preferred_batch_sizes=tuple(p for p in dynamic.preferred_batch_sizes
                                    if p <= config.max_batch_size),
        max_queue_size=dynamic.max_queue_size,
        default_timeout_s=timeout / 1000 if timeout is not None else None,
    )


def instance_settings(config: ModelConfig) -> InstanceSettings:
    return InstanceSettings(count=config.instances, engine=config.engine,
                            engine_settings=config.engine_settings.to_settings(
                                config.max_batch_size))


class ServedVersion:
    def __init__(self, name: str, version: int, config: ModelConfig, pool: InstancePool,
                 stats: VersionStats, pipeline: Pipeline | None = None) -> None:
        self.name, self.version, self.config = name, version, config
        self.label = str(version)
        self.pool = pool
        self.stats = stats
        session = pool.sessions[0]
        self.inputs: list[TensorSpec] = session.inputs
        self.outputs: list[TensorSpec] = session.outputs
        self._specs = {spec.name: spec for spec in self.inputs}
        self._batching = config.batching
        _check_batch_axes(name, self.inputs, self._batching)
        self._limits = axis_limits(name, self.inputs, config)
        self.pipeline = pipeline or Pipeline(name, config, self.inputs, self.outputs)
        self._output_names = [spec.name for spec in self.outputs + self.pipeline.extra_outputs]
        self.batcher = Batcher(pool, batching_settings(config, self.pipeline.ragged), stats)

    @classmethod
    async def load(cls, name: str, version: int, artifact: ModelArtifact,
                   config: ModelConfig, metrics: Metrics) -> ServedVersion:
        """Build the sessions on a worker thread, start the batcher, warm every instance."""
        pool = await asyncio.to_thread(InstancePool.load, artifact, instance_settings(config))
        pipeline: Pipeline | None = None
        try:
            session = pool.sessions[0]
            # Reading a tokenizer or a label file blocks: off the event loop.
            pipeline = await asyncio.to_thread(Pipeline, name, config, session.inputs,
                                               session.outputs)
            stats = metrics.for_version(name, str(version),
                                        max_batch_size=config.max_batch_size,
                                        weight_bytes=weight_bytes(artifact.onnx_path),
                                        on_gpu=config.engine_settings.on_gpu)
            served = cls(name, version, config, pool, stats, pipeline)
            await served.warm_up()
            metrics.serving(stats)
        except BaseException:
            pool.close()
            if pipeline is not None:
                pipeline.close()
            raise
        served.batcher.start()
        return served

    async def warm_up(self) -> None:
        """Run one smallest-possible request on each instance so the first real request
        does not pay for lazy allocations (and a model that cannot run is caught here)."""
        feeds = {spec.name: np.zeros([d if isinstance(d, int) else 1 for d in spec.shape],
                                     dtype=spec.dtype) for spec in self.inputs}
        for instance in self.pool.instances:
            await instance.run(feeds)

    async def infer(self, request: InferRequest) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        batcher, pipeline, stats = self.batcher, self.pipeline, self.stats
        try:
            if pipeline.preprocesses:
                pre_s = await pipeline.prepare(request)
                if pre_s:
                    stats.preprocessed(pre_s)
            rows = self._check(request)
            outputs = await batcher.submit(request.inputs, rows, request.priority,
                                           request.timeout_s)
            if pipeline.steps or _classifies(request):
                post_start = time.perf_counter()
                outputs = pipeline.finish(request, outputs)
                stats.postprocessed(time.perf_counter() - post_start)
        except TurboinferError as exc:
            self.stats.failed(time.perf_counter() - start, _reason(exc), batcher.pending)
            raise
        self.stats.request(time.perf_counter() - start, batcher.pending)
        return outputs

    def _check(self, request: InferRequest) -> int:
        inputs, specs = request.inputs, self._specs
        if len(inputs) != len(specs) or not all(name in specs for name in inputs):
            _name_mismatch(inputs, specs)
        rows = 1
        for name, array in inputs.items():
            spec = specs[name]
            if array.dtype != spec.dtype:
                raise InvalidInputError(
                    f"input {name!r} has datatype {datatype_of(array.dtype)}, the model "
                    f"expects {datatype_of(spec.dtype)}")
            if array.ndim != len(spec.shape) or any(isinstance(d, int) and d != n for d, n
                                                    in zip(spec.shape, array.shape, strict=True)):
                raise InvalidInputError(
                    f"input {name!r} has shape {list(array.shape)}, the model expects "
                    f"{format_shape(spec.shape)}")
            for axis, limit in self._limits.get(name, ()):
                if array.shape[axis] > limit:
                    raise InvalidInputError(
                        f"input {name!r} has {array.shape[axis]} on axis {axis}, over the "
                        f"model's limit of {limit} (max_dims / max_dynamic_dim in its "
                        f"config.yaml)")
            if self._batching:
                rows = array.shape[0]
        if self._batching:
            _check_rows(rows, self.config.max_batch_size)
        if request.outputs is not None:
            check_requested_outputs(request, self._output_names)
        return rows

    async def retire(self, timeout_s: float = 30.0) -> None:
        """Let queued and running requests finish on this version, then free it."""
        await self.batcher.drain(timeout_s)
        self.pool.close()
        self.pipeline.close()

    def tensor_metadata(self) -> dict[str, list[dict[str, Any]]]:
        def describe(spec: TensorSpec) -> dict[str, Any]:
            shape = [d if isinstance(d, int) else -1 for d in spec.shape]
            return {"name": spec.name, "datatype": datatype_of(spec.dtype), "shape": shape}

        return {"inputs": [describe(s) for s in self.inputs] + self.pipeline.raw_metadata(),
                "outputs": [describe(s) for s in self.outputs + self.pipeline.extra_outputs]}

    @property
    def platform(self) -> str:
        return PLATFORMS.get(self.config.engine, self.config.engine)


def _classifies(request: InferRequest) -> bool:
    return request.outputs is not None and any(o.classification for o in request.outputs)


def _check_batch_axes(name: str, specs: list[TensorSpec], batching: bool) -> None:
    if not batching:
        return
    for spec in specs:
        if not spec.shape or isinstance(spec.shape[0], int):
            raise ConfigError(
                f"model {name!r}: max_batch_size > 0 needs a dynamic first axis, but input "
                f"{spec.name!r} has shape {format_shape(spec.shape)}")


def axis_limits(name: str, specs: list[TensorSpec], config: ModelConfig
                ) -> dict[str, tuple[tuple[int, int], ...]]:
    """Per input, (axis, largest size) for each dynamic axis a request may set: from
    ``max_dims``, else ``max_dynamic_dim``; the batch axis is ``max_batch_size``'s."""
    by_name = {spec.name: spec for spec in specs}
    for input_name, dims in config.max_dims.items():
        spec = by_name.get(input_name)
        if spec is None:
            raise ConfigError(f"model {name!r}: max_dims names {input_name!r}, which is no "
                              f"input; the model takes {', '.join(by_name)}")
        if len(dims) != len(spec.shape):
            raise ConfigError(f"model {name!r}: max_dims of {input_name!r} has {len(dims)} "
                              f"axes, the input {len(spec.shape)} "
                              f"({format_shape(spec.shape)})")
    limits: dict[str, tuple[tuple[int, int], ...]] = {}
    for spec in specs:
        given = config.max_dims.get(spec.name) or [None] * len(spec.shape)
        pairs = []
        for axis, (declared, limit) in enumerate(zip(spec.shape, given, strict=True)):
            fixed = isinstance(declared, int)
            batch_axis = axis == 0 and config.batching
            if limit is not None and (fixed or batch_axis):
                what = "the batch axis (max_batch_size bounds it)" if batch_axis else "fixed"
                raise ConfigError(f"model {name!r}: max_dims of {spec.name!r} sets axis "
                                  f"{axis}, which is {what}; use null there")
            if not fixed and not batch_axis:
                pairs.append((axis, limit if limit is not None else config.max_dynamic_dim))
        if pairs:
            limits[spec.name] = tuple(pairs)
    return limits


def _check_rows(rows: int, limit: int) -> None:
    if rows < 1:
        raise InvalidInputError("the batch axis is empty (0 rows)")
    if rows > limit:
        raise InvalidInputError(f"a request of {rows} rows exceeds max_batch_size {limit}")


def _name_mismatch(inputs: dict[str, np.ndarray], specs: dict[str, TensorSpec]) -> None:
    unknown = sorted(set(inputs) - set(specs))
    if unknown:
        raise InvalidInputError(f"unknown input {unknown[0]!r}; the model takes "
                                f"{', '.join(specs)}")
    missing = sorted(set(specs) - set(inputs))
    raise InvalidInputError(f"missing input {missing[0]!r}; the model takes {', '.join(specs)}")


def _reason(exc: TurboinferError) -> str:
    """Failure reasons for metrics, after Triton's REJECTED / BACKEND / OTHER."""
    if isinstance(exc, UnavailableError):
        return "rejected"
    if isinstance(exc, InvalidInputError):
        return "invalid_input"
    return "backend"
