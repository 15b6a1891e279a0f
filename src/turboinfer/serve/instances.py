"""Execution instances: K engine sessions of one model version, each run on its own thread.

ONNX Runtime (and OpenVINO) release the GIL inside ``run``, so threads give real
parallelism without the cost of shipping tensors to other processes. Each instance gets
``cores // K`` intra-op threads unless the configuration fixes a number: K instances
with the engine's default (all cores each) would oversubscribe the machine and every
batch would be slower than with one instance.

The pool can change size while it serves (``resize``, used by the autoscaler and the
idle unload): new instances are built and warmed on a worker thread and join the pool
only when ready; an instance taken out stops being handed out, finishes the batch it
runs, and then frees its session. No request is lost either way.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from turboinfer.engines import EngineSettings, ModelArtifact, Session, TensorSpec, load_session
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


@dataclass(frozen=True)
class SessionFactory:
    """What the pool needs to build more instances of its model while serving."""

    artifact: ModelArtifact
    engine: str
    engine_settings: EngineSettings

    @property
    def fixed_threads(self) -> int:
        """Intra-op threads the configuration fixes (0: split the cores)."""
        return self.engine_settings.intra_op_threads

    def threads_for(self, count: int, cores: int) -> int:
        return self.fixed_threads or split_threads(count, cores)

    def build(self, threads: int) -> Session:
        """Blocking: call it from a worker thread."""
        settings = replace(self.engine_settings, intra_op_threads=threads)
        return load_session(self.artifact, self.engine, settings)


def zero_feeds(specs: list[TensorSpec]) -> dict[str, np.ndarray]:
    """The smallest request the model accepts (dynamic axes as 1), for warm-ups."""
    return {spec.name: np.zeros([d if isinstance(d, int) else 1 for d in spec.shape],
                                dtype=spec.dtype) for spec in specs}


class Instance:
    """One session and the thread that runs it.

    A dedicated thread fed by a ``SimpleQueue`` and answering through
    ``call_soon_threadsafe`` is a cheaper hop than ``run_in_executor`` (its futures,
    locks and callbacks), and the hop is paid on every request of a small model.
    """

    def __init__(self, session: Session, name: str, threads: int = 0,
                 pool: InstancePool | None = None) -> None:
        self.session: Session | None = session
        self.threads = threads  # intra-op threads it was built with (0: unknown)
        self.retired = False
        self._pool = pool
        # (seconds spent in the engine, start of the running job or None): one tuple,
        # assigned whole by the worker thread, so a reader never sees half an update.
        self._busy: tuple[float, float | None] = (0.0, None)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()
        track(self._thread)  # a run may outlive the server (a hung engine): see engine_threads

    async def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.retired and self._pool is not None:
            # Taken out of the pool while the dispatcher held it for the next batch:
            # that batch runs on an instance still in service.
            return await self._pool.run_elsewhere(feeds)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
        self._jobs.put((loop, future, feeds))
        return await future

    @property
    def running(self) -> bool:
        return self._busy[1] is not None

    def busy_seconds(self, now: float) -> float:
        """Seconds spent in the engine so far (``now``: ``time.perf_counter()``)."""
        total, since = self._busy
        return total + (now - since if since is not None else 0.0)

    def _work(self) -> None:
        total = 0.0
        while (job := self._jobs.get()) is not None:
            loop, future, feeds = job
            start = time.perf_counter()
            self._busy = (total, start)
            try:
                assert self.session is not None  # cleared only after the last job
                result = self.session.run(feeds)
            except BaseException as exc:
                loop.call_soon_threadsafe(_fail, future, exc)
            else:
                loop.call_soon_threadsafe(_succeed, future, result)
            total += time.perf_counter() - start
            self._busy = (total, None)
        self.session = None  # the engine's memory goes now, not when the last holder lets go

    def close(self) -> None:
        """Stop after the jobs already given (the running batch finishes)."""
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
    meanwhile make the next batch bigger).

    ``instances`` are those in service; it may be empty (a model idle-unloaded to zero
    instances), and then batches wait until ``resize`` brings one.
    """

    def __init__(self, sessions: list[Session], name: str = "model",
                 factory: SessionFactory | None = None, threads: int = 0) -> None:
        if not sessions:
            raise ValueError("an instance pool needs at least one session")
        self.name = name
        self.factory = factory
        self.instances: list[Instance] = []
        self._free: asyncio.Queue[Instance] = asyncio.Queue()
        self._live = asyncio.Event()
        self._resizing = asyncio.Lock()
        self._serial = 0
        self._closed = False
        self._add([self._instance(s, threads) for s in sessions])

    @classmethod
    def load(cls, artifact: ModelArtifact, settings: InstanceSettings) -> InstancePool:
        """Blocking: builds every session. Call it from a worker thread."""
        threads = settings.per_instance(available_cores()).intra_op_threads
        factory = SessionFactory(artifact, settings.engine, settings.engine_settings)
        sessions = [factory.build(threads) for _ in range(settings.count)]
        return cls(sessions, artifact.name, factory, threads)

    @property
    def sessions(self) -> list[Session]:
        return [i.session for i in self.instances if i.session is not None]

    @property
    def threads(self) -> int:
        """Intra-op threads of the instances in service (0 when there are none)."""
        return self.instances[0].threads if self.instances else 0

    def busy_seconds(self, now: float) -> float:
        """Engine seconds of the instances in service, summed."""
        return sum(i.busy_seconds(now) for i in self.instances)

    async def acquire(self) -> Instance:
        while True:
            instance = await self._free.get()
            if not instance.retired:
                return instance

    def release(self, instance: Instance) -> None:
        if not instance.retired:  # a retired one leaves the pool after its last batch
            self._free.put_nowait(instance)

    async def run_elsewhere(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on the least loaded instance in service, waiting for one if none is."""
        while not self.instances:
            await self._live.wait()
        idle_first = sorted(self.instances, key=lambda i: i.running)
        return await idle_first[0].run(feeds)

    async def resize(self, count: int, threads: int) -> None:
        """Serve with ``count`` instances of ``threads`` intra-op threads each.

        Instances that already fit are kept; the missing ones are built and warmed up
        on a worker thread while the old ones serve on, then join; the rest retire.
        """
        if self.factory is None:
            raise ValueError(f"instance pool {self.name!r} cannot build instances")
        async with self._resizing:
            keep = [i for i in self.instances if i.threads == threads][:count]
            missing = count - len(keep)
            built: list[Instance] = []
            try:
                for _ in range(missing):
                    session = await asyncio.to_thread(self.factory.build, threads)
                    instance = self._instance(session, threads)
                    built.append(instance)
                    await instance.run(zero_feeds(session.inputs))
            except BaseException:
                for instance in built:
                    instance.close()
                raise
            if self._closed:  # the version was retired while these were built
                for instance in built:
                    instance.close()
                return
            self._add(built)
            for instance in [i for i in self.instances if i not in keep and i not in built]:
                self._retire(instance)

    def _instance(self, session: Session, threads: int) -> Instance:
        self._serial += 1
        return Instance(session, f"{self.name}-inst{self._serial}", threads, pool=self)

    def _add(self, instances: list[Instance]) -> None:
        for instance in instances:
            self.instances.append(instance)
            self._free.put_nowait(instance)
        if self.instances:
            self._live.set()

    def _retire(self, instance: Instance) -> None:
        """Hand it out no more; its thread ends after the batch it may be running."""
        instance.retired = True
        self.instances.remove(instance)
        if not self.instances:
            self._live.clear()
        kept = []
        while not self._free.empty():
            free = self._free.get_nowait()
            if free is not instance:
                kept.append(free)
        for free in kept:
            self._free.put_nowait(free)
        instance.close()

    def retire_all(self) -> None:
        """Zero instances (idle unload); batches wait until ``resize`` brings one."""
        for instance in list(self.instances):
            self._retire(instance)

    def close(self) -> None:
        self._closed = True
        self.retire_all()
