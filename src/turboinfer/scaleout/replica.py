"""One model of the repository as a Ray Serve replica: turboinfer's server core over that
model alone, so the replica serves exactly what ``turboinfer serve`` would: the entry's
config.yaml, the engine settings ``tune`` chose, the batcher, the OIP codec.

This class knows nothing of Ray; ``ray_app`` makes it a deployment. The ingress forwards
each request under /v2/models/NAME as a ``Forwarded`` value; the answer travels back with
the statistics the replica observed since its last answer (``events``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from turboinfer.engines import ModelArtifact
from turboinfer.errors import ConfigError
from turboinfer.scaleout.events import Event, RecordingMetrics
from turboinfer.scaleout.forwarding import Forwarded, Reply, call_asgi
from turboinfer.serve.app import create_app
from turboinfer.serve.config import AutoscalingConfig, ModelConfig
from turboinfer.serve.core import ModelControl, ServerCore, ServerSettings
from turboinfer.serve.repository import Repository
from turboinfer.serve.sources import DirectorySource, Snapshot


class ReplicaSource:
    """A repository folder as the replica reads it: Ray adds and removes replicas and
    scales to zero, so the entry's in-server autoscaling and idle unload are off here."""

    def __init__(self, path: Path) -> None:
        self._source = DirectorySource(path)
        self.name = self._source.name

    def read(self) -> Snapshot:
        snapshot = self._source.read()
        config = snapshot.config.model_copy(update={"autoscaling": AutoscalingConfig(),
                                                    "idle_unload_s": None})
        return Snapshot(config, snapshot.versions, snapshot.config_stamp)

    def artifact(self, version: int, config: ModelConfig) -> ModelArtifact:
        return self._source.artifact(version, config)


class ModelReplica:
    """Serves one model; ``start`` loads it (Ray's deployment awaits it in its
    constructor, see ``ray_app``)."""

    def __init__(self, repository: str, name: str, settings: ServerSettings) -> None:
        path = Path(repository) / name
        if not path.is_dir():
            raise ConfigError(f"model folder {path} does not exist on this node")
        self.name = name
        self.metrics = RecordingMetrics()
        settings = replace(settings, repository=Path(repository),
                           model_control=ModelControl.NONE)
        repo = Repository({name: ReplicaSource(path)}, self.metrics,
                          drain_timeout_s=settings.drain_timeout_s)
        self.core = ServerCore(settings, repo, self.metrics)
        self.app = create_app(self.core)

    async def start(self) -> ModelReplica:
        await self.core.repository.load(self.name)  # raises: a replica that cannot
        self.core.started = True                    # serve must not start
        return self

    async def handle(self, request: Forwarded) -> tuple[Reply, list[Event]]:
        """Answer one forwarded request with the server's own HTTP handlers."""
        reply = await call_asgi(self.app, request)
        return reply, self.metrics.drain()

    async def events(self) -> list[Event]:
        """The observations not yet sent with an answer (read before statistics)."""
        return self.metrics.drain()

    async def shutdown(self) -> None:
        """Let the requests inside finish (up to the drain deadline), then free the model."""
        await self.core.drain(self.core.settings.drain_timeout_s)
        await self.core.close()
