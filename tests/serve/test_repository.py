"""The repository in process: poll pick-ups, config changes, removals, version policy."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from turboinfer.errors import ModelLoadError, UnknownModelError
from turboinfer.serve.config import DynamicBatching, ModelConfig, VersionPolicy, write_entry
from turboinfer.serve.metrics import Metrics
from turboinfer.serve.protocol import InferRequest
from turboinfer.serve.repository import Repository
from turboinfer.serve.sources import scan_directory


def _request() -> InferRequest:
    return InferRequest(inputs={"input": np.zeros((1, 16), np.float32)})


def test_poll_picks_up_changes(tmp_path: Path, model_files: dict[str, Path]) -> None:
    root = tmp_path / "repo"
    write_entry(root, "affine", model_files["affine1"], ModelConfig(max_batch_size=8))

    async def scenario() -> None:
        repo = Repository(scan_directory(root), Metrics(), root=root, drain_timeout_s=5)
        await repo.load_all()
        first = repo.get("affine")
        assert first.config.max_batch_size == 8
        await repo.poll_once()
        assert repo.get("affine") is first  # nothing changed: nothing reloaded
        (root / "affine" / "config.yaml").write_text("max_batch_size: 4\n")
        await repo.poll_once()
        second = repo.get("affine")
        assert second is not first and second.config.max_batch_size == 4
        assert (await second.infer(_request()))["output"][0, 0] == 1.0
        write_entry(root, "other", model_files["affine2"], ModelConfig())
        shutil.rmtree(root / "affine")
        await repo.poll_once()
        assert "affine" not in repo and "other" in repo
        assert (await repo.get("other").infer(_request()))["output"][0, 0] == 2.0
        with pytest.raises(UnknownModelError):
            repo.get("affine")
        await repo.close()

    asyncio.run(scenario())


def test_version_policy_and_failures(tmp_path: Path, model_files: dict[str, Path]) -> None:
    root = tmp_path / "repo"
    config = ModelConfig(version_policy=VersionPolicy(specific=(1, 3)))
    for name in ("affine1", "affine2", "affine3"):
        write_entry(root, "affine", model_files[name], config)
    write_entry(root, "broken", model_files["broken"], ModelConfig())

    async def scenario() -> None:
        repo = Repository(scan_directory(root), Metrics(), root=root, drain_timeout_s=5)
        await repo.load_all()
        assert repo.ready_versions("affine") == [1, 3]
        assert repo.get("affine").version == 3
        assert repo.get("affine", "1").version == 1
        with pytest.raises(UnknownModelError, match="no ready version 2"):
            repo.get("affine", "2")
        entry = next(e for e in repo.index() if e["name"] == "broken")
        assert entry["state"] == "UNAVAILABLE" and "cannot load" in entry["reason"]
        with pytest.raises(ModelLoadError, match="broken"):
            await repo.load("broken")
        await repo.close()

    asyncio.run(scenario())


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def test_repository_answers_for_its_models(tmp_path: Path, model_files: dict[str, Path],
                                           hold: Callable[[Any], threading.Event]) -> None:
    root = tmp_path / "repo"
    config = ModelConfig(max_batch_size=8, version_policy=VersionPolicy(all=True),
                         dynamic_batching=DynamicBatching(max_queue_size=1))
    for name in ("affine1", "affine2"):
        write_entry(root, "affine", model_files[name], config)

    async def scenario() -> None:
        repo = Repository(scan_directory(root), Metrics(), root=root, drain_timeout_s=5)
        await repo.load_all()
        assert "affine" in repo and "nope" not in repo
        assert repo.ready_versions("affine") == [1, 2]
        with pytest.raises(UnknownModelError):
            repo.ready_versions("nope")
        # Full only when every version's queue is: batches wait at a gate, and each
        # version gets one request running and one queued.
        versions = [repo.get("affine", number) for number in ("1", "2")]
        gates = [hold(served) for served in versions]
        waiting = []
        for served in versions:
            assert not repo.full("affine")
            waiting.append(asyncio.create_task(served.infer(_request())))
            await _until(lambda s=served: s.batcher.in_flight == 1 and s.batcher.pending == 0)
            waiting.append(asyncio.create_task(served.infer(_request())))
            await _until(lambda s=served: s.batcher.pending == 1)
        assert repo.full("affine") and not repo.full("nope")
        for gate in gates:
            gate.set()
        await asyncio.gather(*waiting)
        assert not repo.full("affine")
        stats = repo.statistics()
        assert [(s["name"], s["version"]) for s in stats] == [("affine", "1"), ("affine", "2")]
        assert [s["inference_count"] for s in stats] == [2, 2]
        assert [s["version"] for s in repo.statistics("affine", "2")] == ["2"]
        assert len(repo.statistics("affine")) == 2
        with pytest.raises(UnknownModelError):
            repo.statistics("nope")
        await repo.close()

    asyncio.run(scenario())
