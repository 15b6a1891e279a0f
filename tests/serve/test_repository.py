"""The repository in process: poll pick-ups, config changes, removals, version policy."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest

from turboinfer.errors import ModelLoadError, UnknownModelError
from turboinfer.serve.config import ModelConfig, VersionPolicy, write_entry
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
        assert "affine" not in repo.models
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
        assert sorted(repo.models["affine"].versions) == [1, 3]
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
