"""Execution instances: K engine sessions of one model version, each run on its own thread.

ONNX Runtime (and OpenVINO) release the GIL inside ``run``, so threads give real
parallelism without the cost of shipping tensors to other processes. Each instance gets
``cores // K`` intra-op threads unless the configuration fixes a number: K instances
with the engine's default (all cores each) would oversubscribe the machine and every
batch would be slower than with one instance.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from turboinfer.engines import EngineSettings, ModelArtifact, Session, load_session


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def split_threads(instances: int, cores: int) -> int:
    """Intra-op threads per instance so that all instances together fill the cores once."""
    return max(1, cores // max(1, instances))


@dataclass(frozen=True)
class InstanceSettings:
    count: int = 1
    engine: str = "onnxruntime"
    engine_settings: EngineSettings = field(default_factory=EngineSettings)

    def per_instance(self, cores: int) -> EngineSettings:
        if self.engine_settings.intra_op_threads:
            return self.engine_settings
        return replace(self.engine_settings,
                       intra_op_threads=split_threads(self.count, cores))


class InstancePool:
    """Free sessions in an asyncio queue: taking one is how the batcher waits for an
    instance, so a batch only forms when it can run at once (requests that arrive
    meanwhile make the next batch bigger)."""

    def __init__(self, sessions: list[Session], name: str = "model") -> None:
        if not sessions:
            raise ValueError("an instance pool needs at least one session")
        self.sessions = sessions
        self._free: asyncio.Queue[Session] = asyncio.Queue()
        for session in sessions:
            self._free.put_nowait(session)
        self._executor = ThreadPoolExecutor(len(sessions), thread_name_prefix=f"{name}-inst")

    @classmethod
    def load(cls, artifact: ModelArtifact, settings: InstanceSettings) -> InstancePool:
        """Blocking: builds every session. Call it from a worker thread."""
        engine_settings = settings.per_instance(available_cores())
        sessions = [load_session(artifact, settings.engine, engine_settings)
                    for _ in range(settings.count)]
        return cls(sessions, artifact.name)

    @property
    def size(self) -> int:
        return len(self.sessions)

    async def acquire(self) -> Session:
        return await self._free.get()

    def release(self, session: Session) -> None:
        self._free.put_nowait(session)

    async def run(self, session: Session, feeds: dict[str, np.ndarray]
                  ) -> dict[str, np.ndarray]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, session.run, feeds)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
