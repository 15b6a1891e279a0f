"""The OpenAI-compatible LLM server on Ray Serve: N replicas of ``turboinfer llm serve``
(each its own engine, engine loop and HTTP routes, built on the replica) behind Ray's
HTTP proxy, which is then the one OpenAI-compatible door: /v1/completions,
/v1/chat/completions (streamed or not), /v1/models, /health, /metrics.

Autoscaling on waiting requests: a replica runs ``max_num_seqs`` sequences at once and
every request beyond that waits for a slot; Ray's ``target_ongoing_requests`` is that
slot count, so the average replica holding more requests than it can run (requests
waiting) for ``upscale_delay_s`` adds a replica, and fewer for ``downscale_delay_s``
removes one. ``max_ongoing_requests`` lets a replica hold its own waiting room
(``max_waiting``) on top, beyond which Ray's router queues.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray import serve

from turboinfer.llm.api import LLM
from turboinfer.llm.server.app import create_app
from turboinfer.llm.server.generation import ServerState
from turboinfer.llm.server.server import SWITCH_INTERVAL_S, build_state
from turboinfer.llm.server.settings import ServerSettings
from turboinfer.scaleout.cluster import LOGGING, RaySettings, ray_serve

APP_NAME = "turboinfer-llm"


@dataclass(frozen=True)
class LLMReplicas:
    """``replicas`` at start (and at least); up to ``max_replicas`` when autoscaling."""

    replicas: int = 1
    max_replicas: int = 1
    cpus_per_replica: float = 1.0
    upscale_delay_s: float = 10.0
    downscale_delay_s: float = 30.0

    def deployment_options(self, max_num_seqs: int, max_waiting: int) -> dict[str, Any]:
        options: dict[str, Any] = {
            "name": "llm",
            "max_ongoing_requests": max_num_seqs + max_waiting,
            "ray_actor_options": {"num_cpus": self.cpus_per_replica},
        }
        if self.max_replicas > self.replicas:
            options["autoscaling_config"] = {
                "min_replicas": self.replicas, "max_replicas": self.max_replicas,
                "initial_replicas": self.replicas,
                "target_ongoing_requests": max_num_seqs,
                "upscale_delay_s": self.upscale_delay_s,
                "downscale_delay_s": self.downscale_delay_s}
        else:
            options["num_replicas"] = self.replicas
        return options


@serve.ingress()
class LLMDeployment:
    """One replica: the engine built here (``build`` runs on the replica's worker
    process, where the weights load), the engine loop on its own thread."""

    # Ray Serve awaits an async constructor; mypy only knows synchronous ones.
    async def __init__(self, build: Callable[[], LLM],  # type: ignore[misc]
                       settings: ServerSettings, model_dir: str) -> None:
        llm = await asyncio.to_thread(build)
        # As in `llm serve`: the engine thread must not hold the event loop back.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.state: ServerState = build_state(llm, settings, Path(model_dir),
                                              asyncio.get_running_loop())
        self.state.loop.start()

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(self.state)

    def __del__(self) -> None:
        self.state.loop.stop()


@dataclass(frozen=True)
class DeployedLLM:
    host: str
    port: int
    model_name: str
    replicas: LLMReplicas
    ray_address: str


def serve_llm(build: Callable[[], LLM], settings: ServerSettings, model_dir: Path,
              max_num_seqs: int, replicas: LLMReplicas, ray_settings: RaySettings,
              on_ready: Callable[[DeployedLLM], None] | None = None) -> None:
    """Deploy the replicas and serve until SIGTERM/SIGINT."""
    deployment = serve.deployment(LLMDeployment).options(  # type: ignore[attr-defined]
        **replicas.deployment_options(max_num_seqs, settings.max_waiting))
    with ray_serve(ray_settings, settings.host, settings.port) as (port, stopper):
        serve.run(deployment.bind(build, settings, str(model_dir)), name=APP_NAME,
                  route_prefix="/", logging_config=LOGGING)
        stopper.serving()
        if on_ready is not None:
            on_ready(DeployedLLM(settings.host, port, settings.model_name, replicas,
                                 ray.get_runtime_context().gcs_address))
        stopper.wait()
