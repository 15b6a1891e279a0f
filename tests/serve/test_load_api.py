"""The explicit load API against a real server: a failed new version is an error the
caller sees while the old version serves on, and swapped-out versions leave no series
in /metrics."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from turboinfer.serve.config import ModelConfig, write_entry

if TYPE_CHECKING:
    from conftest import Server

INFER = "/v2/models/affine/infer"
ROW = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [1.0] * 16}]}
WRONG_SHAPE = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3],
                           "data": [1.0] * 3}]}


@pytest.fixture
def explicit(tmp_path: Path, model_files: dict[str, Path], launch: Callable[..., Server],
             affine_config: ModelConfig) -> Iterator[tuple[Server, Path]]:
    root = tmp_path / "repo"
    write_entry(root, "affine", model_files["affine1"], affine_config)
    server = launch(root, tmp_path / "server.log", "--grpc-port", "-1")
    yield server, root
    assert server.stop() == 0


def _served_version(server: Server) -> tuple[str, float]:
    status, body = server.post_json(INFER, ROW)
    assert status == 200, body
    return body["model_version"], body["outputs"][0]["data"][0]


def test_load_of_a_corrupt_version_fails_while_the_old_serves(
        explicit: tuple[Server, Path], model_files: dict[str, Path],
        affine_config: ModelConfig) -> None:
    server, root = explicit
    assert _served_version(server) == ("1", 3.0)
    write_entry(root, "affine", model_files["broken"], affine_config)  # version 2
    status, body = server.post_json("/v2/repository/models/affine/load", {})
    assert status == 422, body
    assert "version 2" in body["error"] and "still serving version(s) 1" in body["error"]
    assert _served_version(server) == ("1", 3.0)
    status, index = server.post_json("/v2/repository/index", {})
    states = {entry.get("version"): entry["state"] for entry in index}
    assert states == {"1": "READY", "2": "UNAVAILABLE"}


def _series(server: Server, version: str) -> list[str]:
    text = server.request("GET", "/metrics")[1].decode()
    pattern = re.compile(rf'^turboinfer_request_\w+\{{[^}}]*version="{version}"', re.M)
    return pattern.findall(text)


def _wait(condition: Callable[[], Any], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.05)


def test_swapped_out_version_leaves_no_series(
        explicit: tuple[Server, Path], model_files: dict[str, Path],
        affine_config: ModelConfig) -> None:
    server, root = explicit
    assert _served_version(server)[0] == "1"
    assert server.post_json(INFER, WRONG_SHAPE)[0] == 400
    series = _series(server, "1")
    assert any(s.startswith("turboinfer_request_failure") for s in series), series
    write_entry(root, "affine", model_files["affine2"], affine_config)  # version 2
    assert server.post_json("/v2/repository/models/affine/load", {})[0] == 200
    assert _served_version(server) == ("2", 4.0)
    # Version 1 drains, then is freed; its success series go with it, and so must its
    # failure series.
    _wait(lambda: not any(s.startswith("turboinfer_request_success")
                          for s in _series(server, "1")))
    assert _series(server, "1") == []
