"""Does an exported ONNX file compute what its torch source computes?

The file runs in ONNX Runtime on the export's example inputs and on a second, larger
size of every dynamic axis: an axis the export pinned to the example's size fails there,
instead of later in an engine. Each output is compared by its max absolute error, judged
against ``atol`` times the output's scale (its largest magnitude, at least 1), and by
cosine similarity, which is reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from turboinfer.errors import ModelLoadError
from turboinfer.models.sources import TorchSource, one_line

DEFAULT_ATOL = 1e-4


@dataclass(frozen=True)
class CheckResult:
    """One output on one set of inputs: sizes, worst error, cosine, and the bound used."""

    output: str
    shape: tuple[int, ...]
    max_abs_error: float
    cosine: float
    bound: float

    @property
    def ok(self) -> bool:
        return self.max_abs_error <= self.bound

    def to_dict(self) -> dict[str, object]:
        return {"output": self.output, "shape": list(self.shape), "max_abs_error":
                self.max_abs_error, "cosine": self.cosine, "tolerance": self.bound}


def check_export(source: TorchSource, path: Path, atol: float = DEFAULT_ATOL) -> list[CheckResult]:
    """Compare ``path`` with ``source``; ``ModelLoadError`` on the first output over tolerance."""
    session = _session(path)
    results: list[CheckResult] = []
    for feeds in (_numpy(source.examples), grown(source.examples, source.dynamic_axes)):
        expected = _run_source(source, feeds)
        got = _run(session, feeds, source, path)
        for name, want, have in zip(source.output_names, expected, got, strict=True):
            result = compare(name, want, have, atol)
            if not result.ok:
                raise ModelLoadError(_mismatch(source.name, result, feeds, atol))
            results.append(result)
    return results


def compare(name: str, expected: np.ndarray, got: np.ndarray, atol: float) -> CheckResult:
    want = np.asarray(expected, np.float64)
    have = np.asarray(got, np.float64)
    if want.shape != have.shape:
        # A shape mismatch is an error of its own kind: infinite, so it never passes.
        return CheckResult(name, tuple(have.shape), float("inf"), 0.0, 0.0)
    error = float(np.abs(want - have).max()) if want.size else 0.0
    norms = float(np.linalg.norm(want) * np.linalg.norm(have))
    cosine = float((want * have).sum() / norms) if norms > 0 else float(error == 0.0)
    scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
    return CheckResult(name, tuple(want.shape), error, cosine, atol * scale)


def grown(
    examples: Mapping[str, torch.Tensor], dynamic_axes: Mapping[str, Mapping[int, str]]
) -> dict[str, np.ndarray]:
    """The examples with every dynamic axis one longer (rows repeated from the start).

    Axes that share a name grow together, so ``input_ids`` and ``attention_mask`` keep
    one sequence length.
    """
    feeds = {}
    for name, tensor in examples.items():
        array = tensor.detach().numpy()
        for axis in dynamic_axes.get(name, {}):
            size = array.shape[axis]
            array = np.take(array, [i % size for i in range(size + 1)], axis=axis)
        feeds[name] = np.ascontiguousarray(array)
    return feeds


def _numpy(examples: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {name: tensor.detach().numpy() for name, tensor in examples.items()}


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # warnings about unused initializers are not the user's
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelLoadError(f"ONNX Runtime cannot load the export {path}: {one_line(exc)}; "
                             "try another --opset") from None


def _run_source(source: TorchSource, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    try:
        return source.run(feeds)
    except Exception as exc:
        raise ModelLoadError(
            f"{source.name} itself fails on inputs {_shapes(feeds)}: {one_line(exc)}; its "
            "batch axis is fixed (export a .pt2 with dynamic_shapes for the batch axis)"
        ) from None


def _run(
    session: ort.InferenceSession, feeds: dict[str, np.ndarray], source: TorchSource, path: Path
) -> list[np.ndarray]:
    try:
        return list(session.run(list(source.output_names), feeds))
    except Exception as exc:
        raise ModelLoadError(
            f"the export of {source.name} fails on inputs {_shapes(feeds)} in ONNX Runtime: "
            f"{one_line(exc)}; the model code likely fixes a size on a dynamic axis (a reshape "
            "to a constant, a .pt2 exported without dynamic_shapes): make it follow the input"
        ) from None


def _mismatch(name: str, result: CheckResult, feeds: dict[str, np.ndarray], atol: float) -> str:
    if result.max_abs_error == float("inf"):
        return (f"the export of {name} gives output {result.output!r} of shape "
                f"{list(result.shape)} on inputs {_shapes(feeds)}, unlike the source: "
                "a size is pinned in the export; make the model code follow the input's shape")
    return (
        f"the export of {name} differs from the source on output {result.output!r} at inputs "
        f"{_shapes(feeds)}: max abs error {result.max_abs_error:.3g} > {result.bound:.3g} "
        f"(cosine {result.cosine:.6f}); if the model is deterministic in eval mode and the "
        f"difference is expected, raise --atol (now {atol:g})"
    )


def _shapes(feeds: Mapping[str, np.ndarray]) -> str:
    return ", ".join(f"{name}={'x'.join(map(str, v.shape))}" for name, v in feeds.items())
