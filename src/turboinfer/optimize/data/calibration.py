"""Calibration data (the user's arrays or images, the zoo's, or synthetic on request) and
activation ranges.

Ranges are computed once per method with ONNX Runtime's calibrators and saved as ORT's
calibration cache, so quantizing again (the other activation type, a mixed-precision
step) reuses them instead of running the model over the data again.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from onnxruntime.quantization import CalibrationDataReader, create_calibrator
from onnxruntime.quantization import CalibrationMethod as OrtCalibration
from onnxruntime.quantization.calibrate import save_tensors_data
from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

from turboinfer.engines.base import TensorSpec, format_shape
from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.optimize.data.images import load_images
from turboinfer.optimize.data.synthetic import synthetic_feeds
from turboinfer.optimize.data.text import load_text
from turboinfer.optimize.settings import CalibrationMethod, OptimizeSettings

log = logging.getLogger(__name__)

Feeds = dict[str, np.ndarray]
# Samples per calibrator call: bounds the memory the calibrator holds between merges.
CHUNK = 64
# Samples per model run when the batch axis is dynamic.
BATCH = 16
# The most samples held out of the calibration data for the fidelity check.
HOLDOUT_MAX = 256


@dataclass(frozen=True)
class CalibrationSet:
    """Calibration inputs, first axis = samples, and where they came from."""

    feeds: Feeds
    source: str
    notes: tuple[str, ...] = ()
    held_out: Feeds | None = None  # set apart for the fidelity check, never calibrated on

    @property
    def count(self) -> int:
        return len(next(iter(self.feeds.values())))

    def slice(self, start: int, stop: int) -> Feeds:
        return {name: value[start:stop] for name, value in self.feeds.items()}


@dataclass(frozen=True)
class CalibratorSpec:
    """How one method maps onto ORT: its calibrator and the options it needs."""

    ort_method: OrtCalibration
    options: Callable[[OptimizeSettings], dict[str, Any]] = field(default=lambda s: {})
    describe: Callable[[OptimizeSettings], str] = field(default=lambda s: "")


CALIBRATORS: dict[CalibrationMethod, CalibratorSpec] = {
    CalibrationMethod.MINMAX: CalibratorSpec(
        OrtCalibration.MinMax, describe=lambda s: "observed min and max"),
    CalibrationMethod.ENTROPY: CalibratorSpec(
        OrtCalibration.Entropy,
        options=lambda s: {"num_bins": s.entropy_bins, "num_quantized_bins": 128},
        describe=lambda s: f"KL divergence over a {s.entropy_bins}-bin histogram"),
    CalibrationMethod.PERCENTILE: CalibratorSpec(
        OrtCalibration.Percentile,
        options=lambda s: {"num_bins": s.entropy_bins, "percentile": s.percentile},
        describe=lambda s: f"{s.percentile:g}th percentile of |x|"),
}


def load_calibration(entry: Any, specs: list[TensorSpec], settings: OptimizeSettings, *,
                     model_path: Path | None = None, hold_out: bool = False
                     ) -> CalibrationSet:
    """The user's arrays or images, else the zoo entry's data, else synthetic data when
    asked. ``hold_out`` sets samples apart for the fidelity check (``held_out``); the
    calibration then uses only the others."""
    wanted = settings.calib_count
    extra = min(wanted, HOLDOUT_MAX) if hold_out else 0
    feeds, source = _read_source(entry, specs, settings, model_path, wanted + extra)
    feeds = conform(feeds, specs)
    available = len(next(iter(feeds.values())))
    held_out = None
    if hold_out:
        held = holdout_count(available)
        if held < 1:
            raise InvalidInputError(f"calibration data holds {available} sample(s): the "
                                    "fidelity check needs at least 2, one held out")
        held_out = {name: value[available - held :] for name, value in feeds.items()}
        feeds = {name: value[: available - held] for name, value in feeds.items()}
        available -= held
    notes = []
    if available < wanted:
        notes.append(f"calibrated on {available} samples: fewer than the {wanted} asked for "
                     "exist" + (" once some were held out for the fidelity check"
                                if hold_out else ""))
    feeds = {name: value[:wanted] for name, value in feeds.items()}
    if source.startswith("synthetic"):
        notes.append("calibration data is synthetic: ranges and the fidelity check hold "
                     "for random inputs only; pass --calib-data or --calib-images")
    return CalibrationSet(feeds, source, tuple(notes), held_out)


def holdout_count(available: int) -> int:
    """Half of the samples, at most ``HOLDOUT_MAX``: the rest calibrate."""
    return min(available // 2, HOLDOUT_MAX)


def _read_source(entry: Any, specs: list[TensorSpec], settings: OptimizeSettings,
                 model_path: Path | None, count: int) -> tuple[Feeds, str]:
    if settings.calib_data is not None:
        return read_user_data(settings.calib_data), str(settings.calib_data)
    if settings.calib_images is not None:
        images = load_images(settings.calib_images, specs, settings.image_prep, count)
        return images, f"images in {settings.calib_images}"
    if settings.calib_text is not None:
        text = load_text(settings.calib_text, settings.tokenizer, specs, count)
        return text, f"text lines of {settings.calib_text}"
    if entry is not None:
        return dict(entry.calibration(count)), f"builtin:{entry.name}"
    if settings.synthetic_calib:
        log.warning("CALIBRATING ON SYNTHETIC DATA drawn from the input specs: real data "
                    "is better; pass --calib-data FILE or --calib-images DIR")
        return synthetic_feeds(specs, count, model_path), "synthetic (from the input specs)"
    raise ConfigError("no calibration data for this model: pass --calib-data PATH (.npz or "
                      "a folder of .npy, one array per input name), --calib-images DIR, "
                      "--calib-text FILE or --synthetic-calib")


def read_user_data(path: Path) -> Feeds:
    """``.npz`` with one array per input name, or a folder of ``NAME.npy``."""
    if path.is_dir():
        files = sorted(path.glob("*.npy"))
        if not files:
            raise ConfigError(f"data folder {path} holds no .npy files")
        return {file.stem: np.load(file, allow_pickle=False) for file in files}
    if path.suffix == ".npz" and path.is_file():
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    raise ConfigError(f"data {path}: expected an .npz file or a folder of .npy")


def conform(feeds: Mapping[str, np.ndarray], specs: list[TensorSpec], *,
            what: str = "calibration data") -> Feeds:
    """Check names and per-sample shapes against the model; cast to the input dtypes.

    Axis 0 is the sample axis; every other fixed axis must match the model exactly.
    """
    expected = {spec.name for spec in specs}
    unknown = sorted(set(feeds) - expected)
    if unknown:
        raise InvalidInputError(f"{what} has input {unknown[0]!r}, which the model "
                                f"lacks (model inputs: {', '.join(sorted(expected))})")
    counts = set()
    result = {}
    for spec in specs:
        if spec.name not in feeds:
            raise InvalidInputError(f"{what} lacks model input {spec.name!r}")
        result[spec.name] = _conform_one(np.asarray(feeds[spec.name]), spec, what)
        counts.add(len(result[spec.name]))
    if len(counts) > 1:
        raise InvalidInputError(f"{what}: inputs have different sample counts: {counts}")
    if counts == {0}:
        raise InvalidInputError(f"{what} holds no samples")
    return result


def _conform_one(array: np.ndarray, spec: TensorSpec, what: str) -> np.ndarray:
    sample_dims = spec.shape[1:]
    bad_shape = array.ndim != len(spec.shape) or any(
        isinstance(dim, int) and dim > 0 and dim != size
        for dim, size in zip(sample_dims, array.shape[1:], strict=False)
    )
    if bad_shape:
        raise InvalidInputError(
            f"{what}: input {spec.name!r} has shape {list(array.shape)}; the model expects "
            f"samples x {format_shape(sample_dims)}")
    same_kind = np.issubdtype(array.dtype, np.floating) == np.issubdtype(spec.dtype, np.floating)
    if not same_kind:
        raise InvalidInputError(f"{what}: input {spec.name!r} is {array.dtype.name}, "
                                f"the model expects {spec.dtype.name}")
    return array.astype(spec.dtype, copy=False)


class FeedReader(CalibrationDataReader):
    """ORT's reader protocol over in-memory feeds, ``batch`` samples per run."""

    def __init__(self, feeds: Feeds, batch: int) -> None:
        self._feeds = feeds
        self._batch = batch
        self._iter = self._batches()

    def _batches(self) -> Iterator[Feeds]:
        count = len(next(iter(self._feeds.values())))
        for start in range(0, count, self._batch):
            yield {k: v[start : start + self._batch] for k, v in self._feeds.items()}

    def get_next(self) -> Feeds | None:
        return next(self._iter, None)

    def rewind(self) -> None:
        self._iter = self._batches()


def run_batch(specs: list[TensorSpec]) -> int:
    """Samples per run: several when every input's batch axis is dynamic, else one."""
    dynamic = all(spec.shape and not isinstance(spec.shape[0], int) for spec in specs)
    return BATCH if dynamic else 1


def uniform_chunks(count: int, batch: int) -> Iterator[tuple[int, int]]:
    """Sample ranges for one calibrator call each, every run in a call of the same size.

    ORT's histogram collector stacks a call's outputs into one array, which fails when
    the last batch is shorter; the remainder therefore gets a call of its own.
    """
    full = count // batch * batch
    step = max(batch, CHUNK // batch * batch)
    for start in range(0, full, step):
        yield start, min(start + step, full)
    if full < count:
        yield full, count


def compute_ranges(model_path: Path, calib: CalibrationSet, method: CalibrationMethod,
                   settings: OptimizeSettings, specs: list[TensorSpec], cache: Path) -> Path:
    """Run ``method`` over the calibration set; save the ranges as ORT's cache at ``cache``."""
    spec = CALIBRATORS[method]
    op_types = sorted(set(QLinearOpsRegistry) | set(QDQRegistry))
    # The histogram collector prints progress to stdout, which belongs to --json output.
    with contextlib.redirect_stdout(io.StringIO()):
        calibrator = create_calibrator(
            model_path, op_types,
            augmented_model_path=str(cache.with_suffix(".augmented.onnx")),
            calibrate_method=spec.ort_method, extra_options=spec.options(settings))
        batch = run_batch(specs)
        for start, stop in uniform_chunks(calib.count, batch):
            calibrator.collect_data(FeedReader(calib.slice(start, stop), batch))
        ranges = calibrator.compute_data()
    save_tensors_data(ranges, cache)
    cache.with_suffix(".augmented.onnx").unlink(missing_ok=True)
    return cache
