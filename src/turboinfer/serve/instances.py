"""Execution instances: K engine sessions of one model version, each run on its own thread.

ONNX Runtime (and OpenVINO) release the GIL inside ``run``, so threads give real
parallelism without the cost of shipping tensors to other processes. Each instance gets
``cores // K`` intra-op threads unless the configuration fixes a number: K instances
with the engine's default (all cores each) would oversubscribe the machine and every
batch would be slower than with one instance.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field, replace

import numpy as np

from turboinfer.engines import EngineSettings, ModelArtifact, Session, load_session
from turboinfer.hardware import profile
from turboinfer.serve.engine_threads import track


def available_cores() -> int:
    """Cores this process may use: the hardware profile's affinity and cgroup-quota view."""
    return profile(engines=False, gpus=False).cpu.usable_cores


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


class Instance:
    """One session and the thread that runs it.

    A dedicated thread fed by a ``SimpleQueue`` and answering through
    ``call_soon_threadsafe`` is a cheaper hop than ``run_in_executor`` (its futures,
    locks and callbacks), and the hop is paid on every request of a small model.
    """

    def __init__(self, session: Session, name: str) -> None:
        self.session = session
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()
        track(self._thread)  # a run may outlive the server (a hung engine): see engine_threads

    async def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        self._jobs.put((loop, future, feeds))
        return await future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            loop, future, feeds = job
            try:
                result = self.session.run(feeds)
            except BaseException as exc:
                loop.call_soon_threadsafe(_fail, future, exc)
            else:
                loop.call_soon_threadsafe(_succeed, future, result)

    def close(self) -> None:
        self._jobs.put(None)


_Job = tuple[asyncio.AbstractEventLoop, "asyncio.Future[dict[str, np.ndarray]]",
             dict[str, np.ndarray]]


def _succeed(future: asyncio.Future[dict[str, np.ndarray]],
             result: dict[str, np.ndarray]) -> None:
    if not future.done():  # the batch may have been cancelled meanwhile
        future.set_result(result)


def _fail(future: asyncio.Future[dict[str, np.ndarray]], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


class InstancePool:
    """Free instances in an asyncio queue: taking one is how the batcher waits for an
    instance, so a batch only forms when it can run at once (requests that arrive
    meanwhile make the next batch bigger)."""

    def __init__(self, sessions: list[Session], name: str = "model") -> None:
        if not sessions:
            raise ValueError("an instance pool needs at least one session")
        self.sessions = sessions
        self.instances = [Instance(s, f"{name}-inst{i}") for i, s in enumerate(sessions)]
        self._free: asyncio.Queue[Instance] = asyncio.Queue()
        for instance in self.instances:
            self._free.put_nowait(instance)

    @classmethod
    def load(cls, artifact: ModelArtifact, settings: InstanceSettings) -> InstancePool:
        """Blocking: builds every session. Call it from a worker thread."""
        engine_settings = settings.per_instance(available_cores())
        sessions = [load_session(artifact, settings.engine, engine_settings)
                    for _ in range(settings.count)]
        return cls(sessions, artifact.name)

    async def acquire(self) -> Instance:
        return await self._free.get()

    def release(self, instance: Instance) -> None:
        self._free.put_nowait(instance)

    def close(self) -> None:
        for instance in self.instances:
            instance.close()
