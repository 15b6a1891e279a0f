"""The server without its transports: what HTTP and gRPC handlers both call.

Descriptions (metadata, config, statistics) are plain dicts in Triton's JSON shapes; the
gRPC service turns the same dicts into protobuf messages, so both protocols always agree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from turboinfer import __version__
from turboinfer.errors import ConfigError, UnavailableError, UnknownModelError
from turboinfer.serve.config import ModelConfig
from turboinfer.serve.drain import InFlight
from turboinfer.serve.metrics import Metrics
from turboinfer.serve.protocol import InferRequest, datatype_of
from turboinfer.serve.repository import Repository
from turboinfer.serve.version import ServedVersion

EXTENSIONS = ["binary_tensor_data", "classification", "model_repository", "statistics",
              "schedule_policy"]
DEFAULT_ZOO_MODELS = ("digits-cnn", "resnet18")


class ModelControl(str, enum.Enum):
    NONE = "none"  # the repository is read once at start
    POLL = "poll"  # rescanned every poll_seconds; the load/unload API works too
    EXPLICIT = "explicit"  # changes only through the load/unload API


@dataclass(frozen=True)
class ServerSettings:
    repository: Path | None = None  # None: serve the built-in zoo
    zoo_models: tuple[str, ...] = DEFAULT_ZOO_MODELS  # zoo models built and loaded at start
    host: str = "127.0.0.1"
    http_port: int = 8000  # 0: any free port
    grpc_port: int | None = 8001  # None: no gRPC
    model_control: ModelControl = ModelControl.EXPLICIT
    poll_seconds: float = 5.0
    max_body_bytes: int = 64 * 1024 * 1024  # a body with binary tensors
    # An all-JSON body (never more than max_body_bytes): smaller, because parsing it
    # takes about twice its size again and the tensors it holds are a quarter of it.
    max_json_body_bytes: int = 8 * 1024 * 1024
    # Request bodies being read or served at once, all connections together; beyond it
    # a request is refused at once with 503 and Retry-After (one alone always passes).
    max_body_bytes_in_flight: int = 256 * 1024 * 1024
    max_connections: int = 1024  # open HTTP connections; beyond it uvicorn answers 503
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.poll_seconds <= 0:
            raise ConfigError("poll seconds must be > 0")
        if min(self.max_body_bytes, self.max_json_body_bytes) < 1024:
            raise ConfigError("the request body limits must be at least 1024 bytes")
        if self.max_body_bytes_in_flight < 1024:
            raise ConfigError("the in-flight body bytes must be at least 1024")
        if self.max_connections < 1:
            raise ConfigError("max connections must be >= 1")


class ServerCore:
    def __init__(self, settings: ServerSettings, repository: Repository,
                 metrics: Metrics) -> None:
        self.settings = settings
        self.repository = repository
        self.metrics = metrics
        self.started = False
        self.draining = False
        self._in_flight = InFlight()  # infer calls inside the server, for the drain

    @property
    def ready(self) -> bool:
        return self.started and not self.draining

    @property
    def in_flight(self) -> int:
        return self._in_flight.count

    def admit(self, model: str) -> None:
        """Refuse before the body is even read when the answer is known to be 503: a
        burst against a full queue then costs neither bandwidth nor memory."""
        if self.draining:
            raise UnavailableError("the server is shutting down")
        if self.repository.full(model):
            raise UnavailableError(f"queue of model {model!r} is full; retry later")

    async def infer(self, model: str, version: str | None,
                    request: InferRequest) -> tuple[ServedVersion, dict[str, np.ndarray]]:
        if self.draining:
            raise UnavailableError("the server is shutting down")
        served = self.repository.get(model, version)
        if not served.pool.instances:  # idle-unloaded: this request waits for the reload
            self.repository.wake(served)
        in_flight = self._in_flight
        in_flight.enter()
        try:
            return served, await served.infer(request)
        finally:
            in_flight.leave()

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new inference requests (503) and wait up to ``timeout_s`` for those
        inside to finish; True if they all did."""
        self.draining = True
        return await self._in_flight.wait_idle(timeout_s)

    async def close(self) -> None:
        """Free every model; requests still inside after the drain fail."""
        await self.repository.close()

    def has_model(self, model: str) -> bool:
        return model in self.repository

    def repository_index(self) -> list[dict[str, Any]]:
        return self.repository.index()

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "turboinfer", "version": __version__, "extensions": EXTENSIONS}

    def model_metadata(self, model: str, version: str | None) -> dict[str, Any]:
        served = self.repository.get(model, version)
        versions = self.repository.ready_versions(model)
        return {"name": model, "versions": [str(v) for v in versions],
                "platform": served.platform, **served.tensor_metadata()}

    def model_ready(self, model: str, version: str | None) -> bool:
        try:
            self.repository.get(model, version)
        except (UnknownModelError, UnavailableError):
            return False
        return True

    def model_config(self, model: str, version: str | None) -> dict[str, Any]:
        return triton_config(self.repository.get(model, version))

    def statistics(self, model: str | None, version: str | None) -> dict[str, Any]:
        return {"model_stats": self.repository.statistics(model, version)}

    async def load(self, model: str) -> None:
        self._check_control("load")
        await self.repository.load(model)

    async def unload(self, model: str) -> None:
        self._check_control("unload")
        await self.repository.unload(model)

    def _check_control(self, action: str) -> None:
        if self.settings.model_control is ModelControl.NONE:
            raise ConfigError(f"cannot {action} models: the server runs with "
                              "--model-control none")


_TYPES = {"BYTES": "TYPE_STRING"}


def triton_config(served: ServedVersion) -> dict[str, Any]:
    """The version's configuration as Triton's model configuration JSON."""
    config = served.config
    batching = config.max_batch_size > 0

    def tensor(spec: Any) -> dict[str, Any]:
        dims = [d if isinstance(d, int) else -1 for d in spec.shape]
        datatype = datatype_of(spec.dtype)
        return {"name": spec.name, "data_type": _TYPES.get(datatype, f"TYPE_{datatype}"),
                "dims": dims[1:] if batching else dims}

    # A raw input (images, strings) and the tensors it fills are alternatives: each is
    # optional, as Triton marks an input a request may leave out.
    fills = served.pipeline.fills
    filled = {name for names in fills.values() for name in names}
    inputs = [tensor(s) | ({"optional": True} if s.name in filled else {})
              for s in served.inputs]
    inputs += [{"name": name, "data_type": "TYPE_STRING", "dims": [1] if batching else [-1],
                "optional": True} for name in fills]
    result: dict[str, Any] = {
        "name": served.name, "platform": served.platform, "backend": config.engine,
        "max_batch_size": config.max_batch_size,
        "input": inputs,
        "output": [tensor(s) for s in served.outputs],
        "instance_group": [_instance_group(config)],
        "version_policy": _version_policy(served),
    }
    settings = served.batcher.settings
    if batching:
        policy: dict[str, Any] = {"max_queue_size": settings.max_queue_size}
        if settings.default_timeout_s is not None:
            policy["default_timeout_microseconds"] = int(settings.default_timeout_s * 1e6)
        result["dynamic_batching"] = {
            "preferred_batch_size": list(settings.preferred_batch_sizes),
            "max_queue_delay_microseconds": int(settings.max_queue_delay_s * 1e6),
            "default_queue_policy": policy,
        }
    return result


def _instance_group(config: ModelConfig) -> dict[str, Any]:
    """Triton's instance group: KIND_GPU (on GPU 0) for a model served on a GPU; doctor
    reads it to judge the GPU rules only then."""
    if config.engine_settings.on_gpu:
        return {"count": config.instances, "kind": "KIND_GPU", "gpus": [0]}
    return {"count": config.instances, "kind": "KIND_CPU"}


def _version_policy(served: ServedVersion) -> dict[str, Any]:
    policy = served.config.version_policy
    if policy.all:
        return {"all": {}}
    if policy.specific is not None:
        return {"specific": {"versions": list(policy.specific)}}
    return {"latest": {"num_versions": policy.latest or 1}}
