"""The model repository on Ray Serve: one deployment per model, one OIP ingress.

Each model's deployment runs ``ModelReplica`` (turboinfer's server core over that model)
with the replica plan of ``plan.py``: the CPUs of its tuned instances and threads, and
either a fixed replica count or Ray's ``autoscaling_config`` from the entry's
autoscaling section. The ingress deployment (one replica, no CPU reserved: it only
passes bytes) serves the URLs of ``turboinfer serve`` on Ray's HTTP proxy. Every node
must see the repository at the same path (a shared volume on a cluster).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle

from turboinfer.errors import ConfigError
from turboinfer.scaleout.cluster import LOGGING, RaySettings, ray_serve
from turboinfer.scaleout.events import Event
from turboinfer.scaleout.forwarding import Forwarded, Reply
from turboinfer.scaleout.ingress import OipIngress
from turboinfer.scaleout.plan import ReplicaPlan, plan_replicas, tuned_point
from turboinfer.scaleout.replica import ModelReplica
from turboinfer.serve.core import ServerSettings
from turboinfer.serve.metrics import usable_cores, weight_bytes
from turboinfer.serve.sources import scan_directory

log = logging.getLogger(__name__)

APP_NAME = "turboinfer"
INGRESS = "oip-ingress"


class ModelDeployment(ModelReplica):
    """The replica as Ray runs it: Ray awaits an async constructor (mypy knows only
    synchronous ones) and calls ``__del__`` when it stops the replica."""

    async def __init__(  # type: ignore[misc]
            self, repository: str, name: str, settings: ServerSettings) -> None:
        super().__init__(repository, name, settings)
        await self.start()

    async def __del__(self) -> None:
        await self.shutdown()


# Tries of a request whose replica died under it. Every route the ingress forwards is
# free of side effects (inference, metadata; load and unload are refused), so a request
# is sent again when its replica was killed or crashed, or when the router had not yet
# learnt of the death and chose the dead replica.
REPLICA_TRIES = 3


class HandleCaller:
    """A model deployment's handle as the ingress calls it."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self._handle = handle

    async def handle(self, request: Forwarded) -> tuple[Reply, list[Event]]:
        for attempt in range(1, REPLICA_TRIES + 1):
            try:
                result: tuple[Reply, list[Event]] = await self._handle.handle.remote(request)
            except RayActorError:
                if attempt == REPLICA_TRIES:
                    raise
                log.warning("a replica died under a request; sending it again")
                continue
            return result
        raise AssertionError("unreachable")

    async def events(self) -> list[Event]:
        result: list[Event] = await self._handle.events.remote()
        return result


@serve.ingress()
class IngressDeployment:
    def __init__(self, handles: dict[str, DeploymentHandle], settings: ServerSettings) -> None:
        self.oip = OipIngress({name: HandleCaller(h) for name, h in handles.items()},
                              settings)

    def __serve_build_asgi_app__(self) -> OipIngress:
        return self.oip


@dataclass(frozen=True)
class Deployed:
    host: str
    port: int
    plans: dict[str, ReplicaPlan]
    ray_address: str  # the cluster's GCS address, for `ray` commands and drivers


def model_plans(repository: Path, replicas: int | None = None) -> dict[str, ReplicaPlan]:
    """The replica plan of every model in the repository."""
    cores = usable_cores()
    plans = {}
    for name, source in scan_directory(repository).items():
        snapshot = source.read()
        if not snapshot.versions:
            raise ConfigError(f"model {name!r} in {repository} has no version folder")
        newest = source.artifact(max(snapshot.versions), snapshot.config)
        plans[name] = plan_replicas(snapshot.config, cores,
                                    tuned=tuned_point(repository / name), replicas=replicas,
                                    model_bytes=weight_bytes(newest.onnx_path))
    if not plans:
        raise ConfigError(f"model repository {repository} holds no model")
    return plans


def deployment_options(name: str, plan: ReplicaPlan, drain_s: float) -> dict[str, Any]:
    options: dict[str, Any] = {
        "name": f"model-{name}",
        "max_ongoing_requests": plan.max_ongoing_requests,
        "ray_actor_options": {"num_cpus": plan.cpus_per_replica},
        "graceful_shutdown_timeout_s": drain_s,
    }
    autoscaling = plan.ray_autoscaling_config()
    if autoscaling is None:
        options["num_replicas"] = plan.min_replicas
    else:
        options["autoscaling_config"] = autoscaling
    return options


def _deployment(cls: type) -> Any:
    """``serve.deployment`` on a class (Ray's annotation describes only its decorator
    form with options)."""
    return serve.deployment(cls)


def build_application(repository: Path, settings: ServerSettings,
                      plans: dict[str, ReplicaPlan]) -> Any:
    root = str(repository.resolve())
    handles = {
        name: _deployment(ModelDeployment).options(
            **deployment_options(name, plan, settings.drain_timeout_s)).bind(root, name, settings)
        for name, plan in plans.items()}
    ingress = _deployment(IngressDeployment).options(
        name=INGRESS, num_replicas=1, max_ongoing_requests=settings.max_connections,
        ray_actor_options={"num_cpus": 0})
    return ingress.bind(handles, settings)


def serve_repository(settings: ServerSettings, ray_settings: RaySettings,
                     replicas: int | None = None,
                     on_ready: Callable[[Deployed], None] | None = None) -> None:
    """Deploy the repository and serve until SIGTERM/SIGINT."""
    if settings.repository is None:
        raise ConfigError("--ray serves a model repository: give REPO")
    plans = model_plans(settings.repository, replicas)
    with ray_serve(ray_settings, settings.host, settings.http_port) as (port, stopper):
        serve.run(build_application(settings.repository, settings, plans), name=APP_NAME,
                  route_prefix="/", logging_config=LOGGING)
        stopper.serving()
        if on_ready is not None:
            on_ready(Deployed(settings.host, port, plans,
                              ray.get_runtime_context().gcs_address))
        stopper.wait()
