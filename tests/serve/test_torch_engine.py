"""``engine: torch`` in a repository entry, through the real server: a model as code
(``source: builtin:...``) and a ``.pt2`` file serve the same answers as ONNX Runtime;
a GPU entry on a machine without one is one clear line, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import torch
from tests.serve.conftest import Server, start_server

from turboinfer.engines import load_session
from turboinfer.models import resolve_model
from turboinfer.serve.config import load_config

CONFIG = """engine: torch
source: builtin:digits-cnn
max_batch_size: 8
engine_settings: {precision: bf16, channels_last: "on"}
"""


def _infer(server: Server, model: str, images: np.ndarray) -> tuple[int, dict[str, Any]]:
    """One request, the input named as the model's metadata names it (a .pt2 program
    keeps its forward's argument name)."""
    _, body = server.request("GET", f"/v2/models/{model}")
    name = orjson.loads(body)["inputs"][0]["name"]
    doc = {"inputs": [{"name": name, "datatype": "FP32", "shape": list(images.shape),
                       "data": images.ravel().tolist()}]}
    status, body = server.request("POST", f"/v2/models/{model}/infer", orjson.dumps(doc))
    return status, orjson.loads(body)


@pytest.fixture(scope="module")
def torch_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch-repo")
    code = root / "digits"
    (code / "1").mkdir(parents=True)
    (code / "config.yaml").write_text(CONFIG)
    program = root / "digits-pt2"
    (program / "1").mkdir(parents=True)
    model = resolve_model("builtin:digits-cnn")
    assert model.entry is not None
    example = torch.from_numpy(model.entry.example_inputs(2)["input"])
    exported = torch.export.export(model.entry.build().eval(), (example,), dynamic_shapes=(
        {0: torch.export.Dim("batch", min=1, max=64)},))
    torch.export.save(exported, program / "1" / "model.pt2")
    (program / "config.yaml").write_text("engine: torch\nmodel_file: model.pt2\n"
                                         "max_batch_size: 4\n")
    gpu = root / "digits-gpu"
    (gpu / "1").mkdir(parents=True)
    (gpu / "config.yaml").write_text(CONFIG.replace("precision: bf16", "device: cuda"))
    return root


def test_the_torch_settings_are_read_from_config_yaml(torch_repo: Path) -> None:
    config = load_config(torch_repo / "digits" / "config.yaml")
    settings = config.engine_settings.to_settings(config.max_batch_size)
    assert (config.engine, config.source) == ("torch", "builtin:digits-cnn")
    assert (settings.precision.value, settings.channels_last.value,
            settings.max_batch_size) == ("bf16", "on", 8)


@pytest.mark.slow
def test_torch_entries_serve_what_onnxruntime_answers(torch_repo: Path, tmp_path: Path) -> None:
    model = resolve_model("builtin:digits-cnn")
    assert model.entry is not None
    images = model.entry.example_inputs(3)["input"]
    want = load_session(model.artifact, "onnxruntime").run({"input": images})["logits"]
    server = start_server(torch_repo, tmp_path / "server.log", "--model-control", "none")
    try:
        for name, atol in (("digits", 0.25), ("digits-pt2", 1e-4)):
            status, doc = _infer(server, name, images)
            assert status == 200, doc
            (output,) = doc["outputs"]
            assert output["datatype"] == "FP32"
            assert output["shape"] == [3, 10]
            got = np.array(output["data"], dtype=np.float32).reshape(3, 10)
            np.testing.assert_allclose(got, want, atol=atol)
        status, body = server.request("GET", "/v2/models/digits/config")
        config = orjson.loads(body)
        assert config["backend"] == "torch" and config["platform"] == "pytorch_libtorch"
        assert config["instance_group"][0]["kind"] == "KIND_CPU"
        if not torch.cuda.is_available():
            # The GPU entry failed alone, with one line naming the device; the rest serve.
            status, body = server.request("POST", "/v2/repository/index", b"{}")
            index = {e["name"]: e for e in orjson.loads(body)}
            reason = index["digits-gpu"]["reason"]
            assert index["digits-gpu"]["state"] == "UNAVAILABLE"
            assert "device 'cuda' needs a CUDA build of torch and a GPU" in reason
            assert "\n" not in reason
    finally:
        assert server.stop() == 0
    log = (tmp_path / "server.log").read_text()
    assert "Traceback" not in log


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_on_a_machine_without_one_is_one_line_from_the_cli() -> None:
    result = subprocess.run([sys.executable, "-m", "turboinfer", "bench",
                             "builtin:digits-cnn", "--engines", "torch", "--device", "cuda",
                             "--min-runs", "1", "--min-seconds", "0"],
                            capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "device 'cuda' needs a CUDA build of torch and a GPU" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
