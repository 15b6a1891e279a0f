"""The device axis of tune: which devices and forms are searched, how a form is judged
under the budget and ranked, the entry that says where it runs, and a real server that
serves it. Everything here runs on the CPU; the GPU search skips with "needs CUDA"."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from real_server import serve_repository
from turboinfer.cli import main
from turboinfer.engines import Precision, TensorSpec, Toggle, load_session
from turboinfer.errors import ConfigError
from turboinfer.optimize import tune
from turboinfer.optimize.search.batching import CurvePoint, plan_batching
from turboinfer.optimize.search.candidates import Candidate, Measured
from turboinfer.optimize.search.choice import choose
from turboinfer.optimize.search.devices import (
    CPU,
    Placement,
    Search,
    placements,
    resolve_devices,
    torch_source,
)
from turboinfer.optimize.search.tune_report import TABLE_COLUMNS, write_entry_for
from turboinfer.optimize.settings import TuneSettings, Variant, parse_devices
from turboinfer.serve.config import load_config

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")

IMAGE = [TensorSpec("image", np.dtype("float32"), ("batch", 1, 8, 8))]
TOKENS = [TensorSpec("ids", np.dtype("int64"), ("batch", "sequence"))]
TORCH_CPU = {"torch_named": True, "fast_bf16": False}


def test_devices_parse_auto_lists_and_refuse_unknown_names() -> None:
    assert parse_devices(None) == () and parse_devices("auto") == ()
    assert parse_devices("cpu, CUDA,cpu") == ("cpu", "cuda")
    assert parse_devices(["cpu"]) == ("cpu",)
    with pytest.raises(ConfigError, match="auto stands alone"):
        parse_devices("auto,cpu")
    with pytest.raises(ConfigError, match="unknown device 'tpu'"):
        TuneSettings(slo_p99_ms=5, devices=("tpu",))


@no_cuda
def test_auto_is_the_cpu_here_and_cuda_asked_for_is_a_one_line_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert resolve_devices(()) == ("cpu",)
    assert resolve_devices(("cpu",)) == ("cpu",)
    with pytest.raises(ConfigError, match="sees no GPU"):
        resolve_devices(("cpu", "cuda"))
    code = main(["tune", "builtin:digits-cnn", "--slo-p99-ms", "50", "--max-accuracy-drop",
                 "1", "-o", str(tmp_path / "r"), "--devices", "cpu,cuda"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "sees no GPU" in err and "\n" not in err
    assert not (tmp_path / "r").exists()  # refused before any slow work


def test_cpu_forms_of_the_torch_engine_when_it_is_named() -> None:
    named = Search(("cpu",), **TORCH_CPU)
    forms = list(placements("torch", Variant.FP32, named, IMAGE, torch_source=True))
    assert [p.tag for p in forms] == ["", "bf16", "cl", "bf16-cl"]
    # channels_last is for 4-D image inputs only
    assert [p.tag for p in placements("torch", Variant.FP32, named, TOKENS, True)] == [
        "", "bf16"]
    # not named, and no native BF16: the plain module only, as a CPU candidate
    plain = Search(("cpu",), torch_named=False, fast_bf16=False)
    assert list(placements("torch", Variant.FP32, plain, IMAGE, True)) == [CPU]
    # without a source the server could build, no extra forms are searched
    assert list(placements("torch", Variant.FP32, named, IMAGE, False)) == [CPU]
    assert list(placements("onnxruntime", Variant.INT8_STATIC, named, IMAGE, True)) == [CPU]


def test_gpu_forms_per_engine_and_provider() -> None:
    gpu = Search(("cpu", "cuda"), torch_named=False, fast_bf16=False,
                 ort_gpu=("cuda", "tensorrt"))
    torch_forms = list(placements("torch", Variant.FP32, gpu, IMAGE, True))
    assert [p.tag for p in torch_forms] == ["", "cuda-tf32-graphs", "cuda-fp16-graphs",
                                            "cuda-bf16-graphs"]
    assert all(p.channels_last is Toggle.AUTO for p in torch_forms[1:])
    # a dynamic axis besides the batch axis: no CUDA graphs, the eager path on the stream
    assert not any(p.cuda_graphs for p in placements("torch", Variant.FP32, gpu, TOKENS, True))
    ort = {v: [p.tag for p in placements("onnxruntime", v, gpu, IMAGE, True)]
           for v in (Variant.FP32, Variant.FP16, Variant.INT8_STATIC, Variant.INT4)}
    assert ort == {Variant.FP32: ["", "cuda", "tensorrt-fp16"], Variant.FP16: ["", "cuda"],
                   Variant.INT8_STATIC: ["", "tensorrt"], Variant.INT4: [""]}
    # onnxruntime without GPU providers: its candidates stay on the CPU, and a note says why
    bare = Search(("cpu", "cuda"), torch_named=False, fast_bf16=False)
    assert [p.tag for p in placements("onnxruntime", Variant.FP32, bare, IMAGE, True)] == [""]
    assert any("turboinfer[gpu]" in note for note in bare.notes(torch_source=True))
    assert Search(("cpu",), False, False).notes(torch_source=False) == []


def test_a_placement_is_the_entry_engine_settings() -> None:
    placement = Placement("cuda", Precision.FP16, Toggle.ON, True)
    assert placement.entry_settings() == {"device": "cuda", "precision": Precision.FP16,
                                          "channels_last": Toggle.ON, "cuda_graphs": True}
    assert CPU.entry_settings() == {} and CPU.plain and CPU.tag == ""
    settings = placement.engine_settings(threads=1, max_batch_size=64)
    assert (settings.device, settings.precision, settings.max_batch_size) == (
        "cuda", Precision.FP16, 64)


def test_torch_source_names_what_the_server_can_rebuild(digits_model: Any,
                                                        tmp_path: Path) -> None:
    assert torch_source("builtin:digits-cnn", digits_model) == "builtin:digits-cnn"
    onnx_only = type(digits_model)(digits_model.name, type(digits_model.artifact)(
        "x", digits_model.artifact.onnx_path), None)
    assert torch_source(str(digits_model.artifact.onnx_path), onnx_only) is None
    factory = type(digits_model)("m", digits_model.artifact, None)
    assert torch_source("pkg.module:build", factory) == "pkg.module:build"
    assert torch_source(tmp_path / "m.pt2", factory) == str((tmp_path / "m.pt2").resolve())


def _measured(label_tag: Placement, qps: float, engine: str = "torch") -> Measured:
    curve = tuple(CurvePoint(b, 1.0, 1.2, qps * b / 4) for b in (1, 4))
    candidate = Candidate("fp32", Variant.FP32, Path("/m.onnx"), engine, 1, 99.0, True,
                          label_tag, "builtin:m" if engine == "torch" else None)
    return Measured(candidate, curve, plan_batching(curve, 10.0))


def test_between_forms_within_noise_the_plainer_precision_and_the_cpu_win() -> None:
    bf16 = _measured(Placement(precision=Precision.BF16), 1000.0)
    fp32 = _measured(CPU, 1000.0)
    assert choose([bf16, fp32]).chosen == 1  # type: ignore[union-attr]
    gpu = _measured(Placement("cuda", Precision.FP16, cuda_graphs=True), 1000.0)
    assert choose([gpu, fp32]).chosen == 1  # type: ignore[union-attr]
    # a form clearly faster wins, whatever its precision or device
    fast = _measured(Placement("cuda", Precision.FP16, cuda_graphs=True), 5000.0)
    assert choose([fp32, fast]).chosen == 1  # type: ignore[union-attr]
    # a torch candidate without a source is a baseline, never chosen
    baseline = Measured(Candidate("fp32", Variant.FP32, Path("/m.onnx"), "torch", 1, 99.0,
                                  True), fast.curve, fast.plan)
    assert not baseline.servable and choose([baseline, fp32]).chosen == 1  # type: ignore[union-attr]


# --- end to end on the CPU: the torch engine's forms searched, judged, written, served ---


@pytest.fixture(scope="module")
def torch_tune(tmp_path_factory: pytest.TempPathFactory) -> Any:
    repo = tmp_path_factory.mktemp("repo")
    return tune("builtin:digits-cnn", repo, slo_p99_ms=50.0, max_accuracy_drop=1,
                engines=["torch"], devices="cpu", variants=["graph"], batch_sizes=[1, 4],
                threads=[1])


def test_torch_forms_are_searched_and_judged_under_the_budget(torch_tune: Any) -> None:
    by_tag = {m.candidate.placement.tag: m for m in torch_tune.candidates}
    assert set(by_tag) == {"", "bf16", "cl", "bf16-cl"}
    reference = torch_tune.optimize.reference.metric
    for m in by_tag.values():
        assert m.error is None and m.candidate.device == "cpu" and m.servable
        # each form's metric was measured on its own session, then judged on the budget
        assert m.candidate.metric is not None and m.candidate.within_budget is not None
        assert m.candidate.within_budget == (reference - m.candidate.metric <= 1 + 1e-9)
    data = json.loads((torch_tune.work / "report.json").read_text())
    assert data["devices"] == ["cpu"]
    assert {c["device"] for c in data["candidates"]} == {"cpu"}
    assert {c["placement"]["precision"] for c in data["candidates"]} == {"fp32", "bf16"}
    assert TABLE_COLUMNS[1] == "device" and all(row[1] == "cpu"
                                                for row in torch_tune.table_rows())
    page = (torch_tune.work / "report.html").read_text()
    assert "<th>device</th>" in page and "devices searched" in page


def test_the_written_torch_entry_says_where_it_runs_and_a_server_serves_it(
        torch_tune: Any, digits_model: Any, tmp_path: Path) -> None:
    best = torch_tune.best
    assert best is not None and best.eligible and best.candidate.engine == "torch"
    repo = torch_tune.entry.parent.parent
    config = load_config(torch_tune.entry.parent / "config.yaml")
    assert config.engine == "torch" and config.source == "builtin:digits-cnn"
    placement = best.candidate.placement
    assert config.engine_settings.precision is placement.precision
    assert config.engine_settings.channels_last is placement.channels_last
    assert config.engine_settings.device == "cpu"
    assert config.max_batch_size == best.plan.max_batch_size
    # Whichever form won, the BF16 + channels_last form is written beside it, as tune
    # writes an entry, so that the server is shown to load a reduced-precision form.
    bf16 = next(m for m in torch_tune.candidates if m.candidate.placement.tag == "bf16-cl")
    write_entry_for(repo, "digits-bf16", bf16)
    written = yaml.safe_load((repo / "digits-bf16" / "config.yaml").read_text())
    assert written["engine_settings"]["precision"] == "bf16"
    assert written["engine_settings"]["channels_last"] == "on"
    feeds = dict(digits_model.entry.example_inputs(3))
    want = load_session(digits_model.artifact, "onnxruntime").run(feeds)
    with serve_repository(repo, tmp_path / "serve.log") as server:
        for name in ("digits-cnn", "digits-bf16"):
            answer = _infer(server.http_url, name, feeds)
            for output, value in want.items():
                got = np.asarray(answer[output], np.float32).reshape(value.shape)
                assert (got.argmax(1) == value.argmax(1)).all()
                np.testing.assert_allclose(got, value, atol=0.3, rtol=0.05)


def _infer(url: str, model: str, feeds: dict[str, np.ndarray]) -> dict[str, list[float]]:
    body = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": "FP32",
                        "data": v.ravel().tolist()} for k, v in feeds.items()]}
    request = urllib.request.Request(f"{url}/v2/models/{model}/infer",
                                     json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        data = json.loads(response.read())
    return {o["name"]: o["data"] for o in data["outputs"]}


@needs_cuda
def test_on_a_gpu_the_torch_forms_are_judged_on_the_device_and_written(
        tmp_path: Path) -> None:
    report = tune("builtin:digits-cnn", tmp_path, slo_p99_ms=50.0, max_accuracy_drop=1,
                  engines=["torch"], devices="cpu,cuda", variants=["graph"],
                  batch_sizes=[1, 8], threads=[1])
    gpu = [m for m in report.candidates if m.candidate.device == "cuda"]
    assert {m.candidate.placement.precision for m in gpu} == {
        Precision.TF32, Precision.FP16, Precision.BF16}
    assert all(m.error is None and m.candidate.metric is not None for m in gpu)
    assert all(m.candidate.placement.cuda_graphs for m in gpu)
    best = report.best
    assert best is not None
    config = load_config(report.entry.parent / "config.yaml")
    assert config.engine_settings.device == best.candidate.device
    assert config.engine_settings.cuda_graphs == best.candidate.placement.cuda_graphs
