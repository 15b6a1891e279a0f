from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from turboinfer.errors import UnknownModelError
from turboinfer.models import builtin_onnx, resolve_model
from turboinfer.models.cache import cache_dir
from turboinfer.models.export import export_onnx
from turboinfer.models.weights import cached_array
from turboinfer.models.zoo import ZOO, EvalSet, Metric, RunFn, ZooEntry

OrtRunner = Callable[[Path], RunFn]


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def _export(module: torch.nn.Module, example: np.ndarray | torch.Tensor, path: Path) -> Path:
    return export_onnx(
        module,
        {"x": example},
        path,
        input_names=["x"],
        output_names=["y"],
        dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
    )


def test_export_is_quiet_atomic_and_batch_dynamic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], ort_run: OrtRunner
) -> None:
    torch.manual_seed(0)
    module = Affine().eval()
    # A batch-1 example would let torch.export fix the batch at 1; the file must not be.
    path = _export(module, np.ones((1, 6), np.float32), tmp_path / "affine.onnx")
    assert capsys.readouterr().out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["affine.onnx"]
    run = ort_run(path)
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 6)).astype(np.float32)
        expected = module(torch.from_numpy(x)).detach().numpy()
        np.testing.assert_allclose(run({"x": x})["y"], expected, rtol=1e-5, atol=1e-6)


def test_failed_export_leaves_no_file(tmp_path: Path) -> None:
    class Broken(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError("boom")

    with pytest.raises(Exception, match="boom"):
        _export(Broken(), torch.ones(2, 6), tmp_path / "broken.onnx")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def tiny_entry(private_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ZooEntry]:
    builds = []

    def build() -> torch.nn.Module:
        builds.append(1)
        torch.manual_seed(0)
        return Affine().eval()

    def feeds(n: int) -> dict[str, np.ndarray]:
        return {"x": np.ones((n, 6), np.float32)}

    entry = ZooEntry(
        name="tiny-affine",
        description="test model",
        build=build,
        example_inputs=feeds,
        calibration=feeds,
        evaluation=lambda: EvalSet(feeds(4)),
        metric=Metric("none", lambda run, evalset: 0.0),
        input_names=("x",),
        output_names=("y",),
        dynamic_axes={"x": {0: "batch"}},
    )
    monkeypatch.setitem(ZOO, entry.name, entry)
    yield entry
    assert builds


def test_builtin_export_is_cached_and_rebuilt_when_corrupt(
    tiny_entry: ZooEntry, private_cache: Path
) -> None:
    first = resolve_model("builtin:tiny-affine")
    path = first.artifact.onnx_path
    assert path.parent.parent == private_cache and path.name.startswith("tiny-affine-")
    assert first.entry is tiny_entry and first.artifact.torch_module is tiny_entry.build
    stamp = path.stat().st_mtime_ns
    assert builtin_onnx(tiny_entry).stat().st_mtime_ns == stamp  # reused, not re-exported
    path.write_bytes(b"\x00garbage")
    assert resolve_model("builtin:tiny-affine").artifact.onnx_path == path
    assert path.stat().st_size > 100


def test_unknown_references_name_what_exists() -> None:
    with pytest.raises(UnknownModelError, match=r"unknown builtin model 'nope'.*digits-cnn"):
        resolve_model("builtin:nope")
    with pytest.raises(UnknownModelError, match=r"did you mean builtin:resnet18\?"):
        resolve_model("resnet18")
    with pytest.raises(UnknownModelError, match=r"unknown model 'whatever'"):
        resolve_model("whatever")


def test_cache_dir_follows_environment(private_cache: Path) -> None:
    assert cache_dir() == private_cache and private_cache.is_dir()


def test_cached_array_recomputes_a_corrupt_file(private_cache: Path) -> None:
    calls = []

    def compute() -> np.ndarray:
        calls.append(1)
        return np.arange(5.0)

    np.testing.assert_array_equal(cached_array("numbers", compute), np.arange(5.0))
    np.testing.assert_array_equal(cached_array("numbers", compute), np.arange(5.0))
    assert len(calls) == 1
    (private_cache / "reference" / "numbers.npy").write_bytes(b"junk")
    np.testing.assert_array_equal(cached_array("numbers", compute), np.arange(5.0))
    assert len(calls) == 2
