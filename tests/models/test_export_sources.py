"""``turboinfer export`` and on-the-fly export of a user's PyTorch model: a factory named
``user_models:FACTORY`` (tests/models/user_models.py), a TorchScript file, a .pt2 file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from turboinfer.cli import main
from turboinfer.errors import ConfigError
from turboinfer.models import export as export_module
from turboinfer.models import resolve_model
from turboinfer.models.convert import ExportOptions, export_model
from turboinfer.models.export import needs_external_data
from turboinfer.models.sources import InputSpec, parse_input_spec

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def user_models_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


def _input_shapes(path: Path) -> list[list[object]]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [list(i.shape) for i in session.get_inputs()]


def test_input_spec_syntax() -> None:
    assert parse_input_spec("image=1x3x32x32:float32") == InputSpec("image", (1, 3, 32, 32))
    assert parse_input_spec("ids=2x16:int64") == InputSpec("ids", (2, 16), "int64")
    for bad in ("image", "=2x3", "x=2xa", "x=0x3", "x=2x3:floaty"):
        with pytest.raises(ConfigError, match="expected NAME=D1xD2"):
            parse_input_spec(bad)


def test_external_data_threshold() -> None:
    assert not needs_external_data(1_000_000)
    assert not needs_external_data(1_800_000_000)
    assert needs_external_data(2**31)


def test_factory_with_example_inputs_hook(tmp_path: Path) -> None:
    report = export_model("user_models:make_cnn", tmp_path / "cnn.onnx")
    assert _input_shapes(report.path) == [["batch", 3, 16, 16]]
    # The example (batch 1) and a second batch size, both within tolerance.
    assert [c.shape for c in report.checks] == [(1, 10), (2, 10)]
    assert all(c.ok and c.cosine > 0.9999 for c in report.checks)


def test_cli_export_with_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mlp.onnx"
    code = main(["export", "user_models:make_mlp", "--example-input", "x=3x16", "-o", str(out),
                 "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", 16]}]
    assert [c["shape"] for c in report["checks"]] == [[3, 4], [4, 4]]
    assert all(c["max_abs_error"] < 1e-5 for c in report["checks"])


def test_large_model_keeps_weights_beside_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export_module, "_SINGLE_FILE_LIMIT", 0)  # every model counts as big
    options = ExportOptions(example_inputs=(InputSpec("x", (2, 16)),))
    report = export_model("user_models:make_mlp", tmp_path / "mlp.onnx", options)
    assert report.external_data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx", "mlp.onnx.data"]
    assert all(c.ok for c in report.checks)


def test_torchscript_file(tmp_path: Path) -> None:
    from user_models import make_mlp  # the helper module, on sys.path only during tests

    torch.jit.script(make_mlp()).save(str(tmp_path / "mlp.pt"))
    options = ExportOptions(example_inputs=(InputSpec("x", (2, 16)),))
    report = export_model(str(tmp_path / "mlp.pt"), tmp_path / "mlp.onnx", options)
    assert _input_shapes(report.path) == [["batch", 16]]
    assert all(c.ok for c in report.checks)


def test_torch_export_file_carries_its_inputs(tmp_path: Path) -> None:
    from user_models import make_mlp  # the helper module, on sys.path only during tests

    program = torch.export.export(make_mlp(), (torch.randn(2, 16),),
                                  dynamic_shapes=({0: torch.export.Dim("b")},))
    torch.export.save(program, str(tmp_path / "mlp.pt2"))
    report = export_model(str(tmp_path / "mlp.pt2"), tmp_path / "mlp.onnx")
    assert _input_shapes(report.path) == [["batch", 16]]
    assert [c.shape for c in report.checks] == [(2, 4), (3, 4)]


def test_bench_and_torch_engine_on_a_factory(
    private_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", "user_models:make_cnn", "--engines", "onnxruntime,torch",
                 "--batch-sizes", "2", "--min-runs", "2", "--min-seconds", "0", "--json"])
    assert code == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert sorted(r["engine"] for r in results) == ["onnxruntime", "torch"]
    first = resolve_model("user_models:make_cnn").artifact
    assert first.onnx_path.parent == private_cache / "onnx"
    stamp = first.onnx_path.stat().st_mtime_ns
    again = resolve_model("user_models:make_cnn").artifact
    assert again.onnx_path == first.onnx_path and again.onnx_path.stat().st_mtime_ns == stamp
    assert callable(again.torch_module)
    module = again.torch_module()
    image = torch.randn(3, 3, 16, 16)
    onnx_out = ort.InferenceSession(str(again.onnx_path)).run(None, {"image": image.numpy()})[0]
    np.testing.assert_allclose(module(image).detach().numpy(), onnx_out, atol=1e-5)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    """A .pt2 exported without dynamic shapes (batch pinned), a TorchScript file."""
    from user_models import make_mlp  # the helper module, on sys.path only during tests

    pinned, script = tmp_path / "pinned.pt2", tmp_path / "mlp.pt"
    torch.export.save(torch.export.export(make_mlp(), (torch.randn(2, 16),)), str(pinned))
    torch.jit.script(make_mlp()).save(str(script))
    return {"PINNED": str(pinned), "SCRIPT": str(script)}


@pytest.mark.parametrize(("source", "extra", "message"), [
    ("no_such_pkg.models:make", [], "cannot import 'no_such_pkg.models'"),
    ("user_models:nope", [], "has no callable 'nope'"),
    ("user_models:make_number", [], "returned int, not a torch.nn.Module"),
    ("SCRIPT", [], "needs example inputs: pass --example-input"),
    ("user_models:make_eig", ["--example-input", "x=2x4x4"], "aten.linalg_eig"),
    ("user_models:make_noisy", ["--example-input", "x=2x4"], "differs from the source"),
    ("PINNED", [], "fails on inputs x=3x16"),  # its batch stays 2
])
def test_errors_are_one_line_exit_2(
    source: str, extra: list[str], message: str, tmp_path: Path, files: dict[str, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    source = files.get(source, source)
    out = tmp_path / "out.onnx"
    assert main(["export", source, "-o", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err
    assert not out.exists()
