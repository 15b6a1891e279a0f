"""The model repository at run time: which versions serve, loading, blue-green swaps.

A (re)load is blue-green: the new versions are built and warmed up while the old ones
keep serving; then the routing table is replaced in one assignment on the event loop,
and each retired version drains (its queued and running requests finish on it) before
it is freed. If any new version fails to load or warm up, no old version is retired,
the failure is kept for the repository index and logged, and the load raises naming the
failed versions (the explicit load API answers 422 while the old versions serve on).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turboinfer.errors import (
    InvalidInputError,
    ModelLoadError,
    TurboinferError,
    UnavailableError,
    UnknownModelError,
)
from turboinfer.serve.autoscale import Autoscaler
from turboinfer.serve.config import Canary
from turboinfer.serve.metrics import Metrics
from turboinfer.serve.sources import ModelSource, Snapshot, scan_directory
from turboinfer.serve.version import ServedVersion

log = logging.getLogger(__name__)


@dataclass
class ModelState:
    source: ModelSource
    snapshot: Snapshot | None = None
    versions: dict[int, ServedVersion] = field(default_factory=dict)
    failures: dict[int, str] = field(default_factory=dict)
    error: str | None = None  # a model-level problem (e.g. an invalid config.yaml)
    latest: ServedVersion | None = None
    stable: ServedVersion | None = None  # with a canary: the newest non-canary version
    canary: ServedVersion | None = None
    canary_percent: float = 0.0
    canary_credit: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def install(self, versions: dict[int, ServedVersion], canary: Canary | None) -> None:
        self.versions = versions
        self.latest = versions[max(versions)] if versions else None
        self.canary = versions.get(canary.version) if canary else None
        canary_number = self.canary.version if self.canary else None
        others = [v for v in versions if v != canary_number]
        self.stable = versions[max(others)] if others else None
        self.canary_percent = canary.percent if canary and self.canary else 0.0

    def route(self) -> ServedVersion | None:
        if self.canary_percent and self.stable is not None:
            # A credit counter instead of a coin flip: the split is exact over any window.
            self.canary_credit += self.canary_percent
            if self.canary_credit >= 100.0:
                self.canary_credit -= 100.0
                return self.canary
            return self.stable
        return self.latest


def _partial_failure(name: str, failures: dict[int, str], serving: list[int]) -> str:
    failed = "; ".join(f"version {v}: {reason}" for v, reason in sorted(failures.items()))
    return (f"model {name!r}: {len(failures)} version(s) failed to load ({failed}); "
            f"still serving version(s) {', '.join(map(str, serving))}")


class Repository:
    def __init__(self, sources: dict[str, ModelSource], metrics: Metrics,
                 root: Path | None = None, drain_timeout_s: float = 30.0) -> None:
        self._models = {name: ModelState(source) for name, source in sources.items()}
        self.metrics = metrics
        self.root = root
        self.drain_timeout_s = drain_timeout_s
        self._retiring: set[asyncio.Task[None]] = set()
        self.autoscaler = Autoscaler(metrics, self._served, on_wake_failed=self._wake_failed)

    # --- the hot path -------------------------------------------------------------
    def get(self, name: str, version: str | None = None) -> ServedVersion:
        state = self._models.get(name)
        if state is None:
            raise UnknownModelError(f"unknown model {name!r}")
        if not version:
            served = state.route()
            if served is None:
                raise UnavailableError(f"model {name!r} is not ready: {self._why(state)}")
            return served
        try:
            served = state.versions.get(int(version))
        except ValueError:
            raise InvalidInputError(f"model version must be an integer, got {version!r}") from None
        if served is None:
            ready = ", ".join(str(v) for v in sorted(state.versions)) or "none"
            raise UnknownModelError(
                f"model {name!r} has no ready version {version} (ready: {ready})")
        return served

    # --- loading --------------------------------------------------------------------
    async def load_all(self, names: list[str] | None = None) -> None:
        """Load ``names`` (default: every model); failures stay in the index."""
        self.autoscaler.start()
        chosen = list(self._models) if names is None else names
        results = await asyncio.gather(*(self.load(name) for name in chosen),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, TurboinferError):
                raise result

    async def load(self, name: str) -> None:
        """Load or reload ``name`` from its source; raise if any wanted version failed
        (the versions that did load, or the old ones, serve on)."""
        self.autoscaler.start()
        state = self._models.get(name)
        if state is None and self.root is not None:
            state = await self._discover(name)
        if state is None:
            raise UnknownModelError(f"unknown model {name!r}")
        async with state.lock:
            try:
                snapshot = await asyncio.to_thread(state.source.read)
            except TurboinferError as exc:
                state.error = str(exc)
                log.error("model %s: %s", name, exc)
                raise
            await self._apply(state, snapshot)

    async def _discover(self, name: str) -> ModelState | None:
        assert self.root is not None
        sources = await asyncio.to_thread(scan_directory, self.root)
        if name not in sources:
            return None
        return self._models.setdefault(name, ModelState(sources[name]))

    async def _apply(self, state: ModelState, snapshot: Snapshot) -> None:
        name, config = state.source.name, snapshot.config
        wanted = config.version_policy.select(list(snapshot.versions))
        old_snapshot = state.snapshot
        keep: dict[int, ServedVersion] = {}
        failures: dict[int, str] = {}
        for version in wanted:
            current = state.versions.get(version)
            if current is not None and old_snapshot is not None and \
                    old_snapshot.config == config and \
                    old_snapshot.versions.get(version) == snapshot.versions[version]:
                keep[version] = current
                continue
            try:
                keep[version] = await self._load_version(state, version, snapshot)
            except Exception as exc:  # any failure must leave the old versions serving
                failures[version] = str(exc) if isinstance(exc, TurboinferError) else repr(exc)
                log.error("model %s version %d failed to load: %s", name, version,
                          failures[version])
                if version not in state.versions:  # no series for a version that never served
                    self.metrics.forget(name, str(version))
        if failures:
            for version, current in state.versions.items():
                keep.setdefault(version, current)
        retired = [v for k, v in state.versions.items() if keep.get(k) is not v]
        state.install(keep, config.canary)
        state.snapshot, state.failures, state.error = snapshot, failures, None
        self._retire(retired)
        if not keep:
            reason = next(iter(failures.values()), "no version folder holds a model")
            state.error = reason
            raise ModelLoadError(f"model {name!r}: {reason}")
        if failures:  # the old versions serve on, but the load the caller asked for failed
            raise ModelLoadError(_partial_failure(name, failures, sorted(keep)))

    async def _load_version(self, state: ModelState, version: int,
                            snapshot: Snapshot) -> ServedVersion:
        artifact = await asyncio.to_thread(state.source.artifact, version, snapshot.config)
        served = await ServedVersion.load(state.source.name, version, artifact,
                                          snapshot.config, self.metrics)
        log.info("model %s version %d ready", state.source.name, version)
        return served

    async def unload(self, name: str, drain_timeout_s: float | None = None) -> None:
        """Stop serving ``name``; its versions drain for ``drain_timeout_s`` (default:
        the repository's) before they are freed."""
        state = self._state(name)
        async with state.lock:
            retired = list(state.versions.values())
            state.install({}, None)
            state.snapshot, state.failures, state.error = None, {}, "unloaded"
            self._retire(retired, drain_timeout_s)

    def _retire(self, versions: list[ServedVersion], timeout_s: float | None = None) -> None:
        self._update_gauge()
        timeout_s = self.drain_timeout_s if timeout_s is None else timeout_s
        for served in versions:
            task = asyncio.get_running_loop().create_task(self._retire_one(served, timeout_s))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _retire_one(self, served: ServedVersion, timeout_s: float) -> None:
        await served.retire(timeout_s)
        state = self._models.get(served.name)
        # A reload of the same version number shares its metric series: keep them.
        if state is None or served.version not in state.versions:
            self.metrics.forget(served.name, served.label)
        log.info("model %s version %s retired", served.name, served.label)

    def _update_gauge(self) -> None:
        self.metrics.loaded.set(sum(len(s.versions) for s in self._models.values()))

    # --- autoscaling and idle unload -------------------------------------------------------
    def _served(self) -> list[ServedVersion]:
        return [v for state in self._models.values() for v in state.versions.values()]

    def wake(self, served: ServedVersion) -> None:
        """A request for a version idle-unloaded to zero instances: reload them; the
        request waits in the version's queue meanwhile."""
        self.autoscaler.wake(served)

    def _wake_failed(self, served: ServedVersion, reason: str) -> None:
        """The version could not be rebuilt after idle: it stops serving, the requests
        waiting for it fail (503), and the index gives the reason."""
        state = self._models.get(served.name)
        if state is None or state.versions.get(served.version) is not served:
            return
        versions = {k: v for k, v in state.versions.items() if v is not served}
        state.install(versions, state.snapshot.config.canary if state.snapshot else None)
        state.failures[served.version] = reason
        if not versions:
            state.error = reason
        self._retire([served], 0.0)

    # --- polling ------------------------------------------------------------------------
    async def poll_once(self) -> None:
        """Pick up new, changed and removed models and versions under the root."""
        if self.root is None:
            return
        sources = await asyncio.to_thread(scan_directory, self.root)
        for name in [n for n in self._models if n not in sources]:
            await self.unload(name)
            del self._models[name]
        for name, source in sources.items():
            state = self._models.setdefault(name, ModelState(source))
            try:
                snapshot = await asyncio.to_thread(source.read)
            except TurboinferError as exc:
                if state.error != str(exc):
                    state.error = str(exc)
                    log.error("model %s: %s", name, exc)
                continue
            if snapshot != state.snapshot and state.error != "unloaded":
                async with state.lock:
                    # A failure is recorded in the state for the index; keep polling.
                    with contextlib.suppress(TurboinferError):
                        await self._apply(state, snapshot)

    async def close(self) -> None:
        """Free every version at once. The server waits for its requests before it
        closes the repository (one drain deadline); whatever is still queued fails."""
        await self.autoscaler.close()
        for name in list(self._models):
            await self.unload(name, drain_timeout_s=0.0)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)

    # --- questions -------------------------------------------------------------------
    def __contains__(self, name: object) -> bool:
        return name in self._models

    def full(self, name: str) -> bool:
        """True when every ready version of ``name`` has a full queue, so a request for
        it would be refused anyway (asked on the hot path, before the body is read)."""
        state = self._models.get(name)
        if state is None or not state.versions:
            return False
        return all(served.batcher.full for served in state.versions.values())

    def ready_versions(self, name: str) -> list[int]:
        """The version numbers of ``name`` that serve now, ascending."""
        return sorted(self._state(name).versions)

    def statistics(self, name: str | None = None,
                   version: str | None = None) -> list[dict[str, Any]]:
        """Triton's per-version statistics: one version, every version of ``name``, or
        every served version (by model, then version)."""
        if name and version:
            served = [self.get(name, version)]
        elif name:
            versions = self._state(name).versions
            served = [versions[v] for v in sorted(versions)]
        else:
            served = [state.versions[v] for _, state in sorted(self._models.items())
                      for v in sorted(state.versions)]
        return [s.stats.to_dict() for s in served]

    def _state(self, name: str) -> ModelState:
        state = self._models.get(name)
        if state is None:
            raise UnknownModelError(f"unknown model {name!r}")
        return state

    def index(self) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        for name, state in sorted(self._models.items()):
            numbers = sorted(set(state.versions) | set(state.failures))
            for number in numbers:
                entry = {"name": name, "version": str(number), "state": "READY",
                         "reason": state.error or ""}
                if number in state.failures:
                    entry["reason"] = state.failures[number]
                    if number not in state.versions:
                        entry["state"] = "UNAVAILABLE"
                entries.append(entry)
            if not numbers:
                entries.append({"name": name, "state": "UNAVAILABLE",
                                "reason": self._why(state)})
        return entries

    def _why(self, state: ModelState) -> str:
        return state.error or "not loaded"
