"""What the optimizer and the tuner are asked to do: variants, calibration, budget, SLO,
engines. API keywords are parsed and validated once, here, into frozen settings.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from turboinfer.errors import ConfigError

E = TypeVar("E", bound=enum.Enum)


class Variant(str, enum.Enum):
    """One way of rewriting the model. ``FP32`` is the untouched reference."""

    FP32 = "fp32"
    GRAPH = "graph"
    FP16 = "fp16"
    INT8_DYNAMIC = "int8-dynamic"
    INT8_STATIC = "int8-static"
    INT4 = "int4"
    MIXED = "mixed"  # int8-static with the most sensitive layers kept in float
    # OpenVINO's own post-training INT8 (NNCF), saved as OpenVINO IR; tune adds them when
    # openvino is a candidate engine and int8-static is asked for.
    NNCF_INT8 = "nncf-int8"
    NNCF_ACCURACY = "nncf-accuracy"  # NNCF keeping layers in float until the budget holds
    # Quantization-aware training: fine-tuned with fake INT8, then static INT8 (MinMax).
    QAT = "qat"


# What runs unless ``--variants`` says otherwise; FP32 is always measured, MIXED follows
# from a budget. QAT trains, so it runs only when asked.
DEFAULT_VARIANTS = (Variant.GRAPH, Variant.FP16, Variant.INT8_DYNAMIC, Variant.INT8_STATIC,
                    Variant.INT4)
REQUESTABLE = (*DEFAULT_VARIANTS, Variant.QAT)


class CalibrationMethod(str, enum.Enum):
    MINMAX = "minmax"
    ENTROPY = "entropy"
    PERCENTILE = "percentile"


class MetricKind(str, enum.Enum):
    """Built-in metrics over labels (``--metric``); None infers one from labels and output."""

    TOP1 = "top1"  # percent of arg-max == label
    COSINE = "cosine"  # mean cosine x 100 to label vectors
    F1 = "f1"  # macro F1 in percent
    MAE = "mae"  # mean absolute error, in the labels' unit; lower is better


@dataclass(frozen=True)
class ImagePrep:
    """How a folder of images becomes model inputs: shorter side resized to ``resize``,
    centre crop of ``crop`` (None: the model's fixed height/width, else ``resize``), scaled
    to [0, 1], then ``(x - mean) / std`` per RGB channel, laid out NCHW."""

    resize: int = 256
    crop: int | None = None
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)

    def __post_init__(self) -> None:
        if self.resize < 1 or (self.crop is not None and not 1 <= self.crop <= self.resize):
            raise ConfigError("--resize must be >= 1 and --crop in [1, resize]")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ConfigError("--mean and --std take three numbers (R,G,B), std > 0")


class ActivationType(str, enum.Enum):
    """Element type of quantized activations (weights are always signed int8)."""

    UINT8 = "uint8"
    INT8 = "int8"


@dataclass(frozen=True)
class AccuracyBudget:
    """The largest metric drop allowed: absolute (in the metric's unit) or relative (%).

    ``parse("1")`` is one point; ``parse("1%")`` is one percent of the reference value.
    A negative budget asks for an improvement, which nothing may meet; it is allowed so
    that the FP32 fallback can be exercised and explained.
    """

    value: float
    relative: bool = False

    @classmethod
    def parse(cls, text: str) -> AccuracyBudget:
        raw = text.strip()
        relative = raw.endswith("%")
        try:
            value = float(raw.rstrip("%"))
        except ValueError:
            raise ConfigError(f"accuracy budget must be a number or N%: {text!r}") from None
        return cls(value, relative)

    def allowed_drop(self, reference: float) -> float:
        return abs(reference) * self.value / 100.0 if self.relative else self.value

    def drop(self, reference: float, value: float, higher_is_better: bool) -> float:
        """How much worse ``value`` is than ``reference`` (negative when better)."""
        return reference - value if higher_is_better else value - reference

    def meets(self, reference: float, value: float, higher_is_better: bool) -> bool:
        # A tiny tolerance so that a model equal to the reference meets a zero budget.
        drop = self.drop(reference, value, higher_is_better)
        return drop <= self.allowed_drop(reference) + 1e-9

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.relative else f"{self.value:g}"


@dataclass(frozen=True)
class MeasureSettings:
    """How latency is timed for every variant: batch 1 on the default engine."""

    engine: str = "onnxruntime"
    min_runs: int = 30
    min_seconds: float = 0.5
    warmup_runs: int = 3

    def __post_init__(self) -> None:
        if self.min_runs < 1 or self.min_seconds < 0 or self.warmup_runs < 0:
            raise ConfigError("min runs must be >= 1, seconds and warm-up >= 0")


@dataclass(frozen=True)
class OptimizeSettings:
    variants: tuple[Variant, ...] = DEFAULT_VARIANTS
    calibrations: tuple[CalibrationMethod, ...] = tuple(CalibrationMethod)
    calib_data: Path | None = None
    calib_count: int = 500
    calib_images: Path | None = None  # a folder of images, prepared by ``image_prep``
    image_prep: ImagePrep = ImagePrep()
    calib_text: Path | None = None  # text lines, tokenized with ``tokenizer``
    tokenizer: Path | None = None  # the model folder's tokenizer.json
    # Inputs drawn from the model's input specs; only when asked: they say little about
    # real data, and a budget measured on them holds only for that distribution.
    synthetic_calib: bool = False
    # ``.npz``, a folder of ``.npy`` (inputs by name plus ``labels``) or ``module:function``
    eval_data: str | None = None
    metric: MetricKind | None = None  # None: inferred from the labels and the output
    percentile: float = 99.99
    entropy_bins: int = 2048  # ORT's default 128 makes Entropy equal MinMax
    int4_block_size: int = 32
    sensitivity: bool = False
    budget: AccuracyBudget | None = None
    # None: take the profile's choice and verify it against the other type by timing.
    activation_type: ActivationType | None = None
    measure: MeasureSettings = MeasureSettings()
    # QAT's training data: ``.npz`` / folder of ``.npy`` with the inputs (+ ``labels``);
    # None: the calibration samples, distilled from the float model.
    train_data: Path | None = None
    qat_epochs: int = 10
    qat_minutes: float | None = None  # a time budget for QAT's training

    def __post_init__(self) -> None:
        if self.qat_epochs < 1:
            raise ConfigError(f"QAT epochs must be >= 1, got {self.qat_epochs}")
        if self.qat_minutes is not None and self.qat_minutes <= 0:
            raise ConfigError(f"--qat-minutes must be > 0, got {self.qat_minutes}")
        unknown = [v for v in self.variants if v not in REQUESTABLE]
        if unknown:
            raise ConfigError(f"variant {unknown[0].value!r} cannot be requested")
        if not self.variants:
            raise ConfigError("at least one variant is needed")
        if Variant.INT8_STATIC in self.variants and not self.calibrations:
            raise ConfigError("int8-static needs at least one calibration method")
        if self.calib_count < 1:
            raise ConfigError("calibration count must be >= 1")
        if not 50.0 < self.percentile <= 100.0:
            raise ConfigError(f"percentile must be in (50, 100], got {self.percentile}")
        if self.entropy_bins < 128:
            raise ConfigError("entropy calibration needs at least 128 histogram bins")
        if self.int4_block_size not in (16, 32, 64, 128, 256):
            raise ConfigError("int4 block size must be a power of two from 16 to 256")
        if self.calib_data is not None and self.calib_images is not None:
            raise ConfigError("give --calib-data or --calib-images, not both")
        if self.calib_text is not None and (self.calib_data or self.calib_images):
            raise ConfigError("give one of --calib-data, --calib-images, --calib-text")
        if self.calib_images is not None and not self.calib_images.is_dir():
            raise ConfigError(f"--calib-images {self.calib_images}: not a folder")
        if self.eval_data is not None:
            check_eval_data(self.eval_data)
        elif self.metric is not None:
            raise ConfigError("--metric needs --eval-data with labels to compute it on")

    @property
    def needs_calibration(self) -> bool:
        return Variant.INT8_STATIC in self.variants or Variant.QAT in self.variants


# Which engine can tune which variant: ORT runs everything it wrote (contrib ops
# included); OpenVINO reads standard ONNX, QDQ included; torch runs only the FP32 module
# and is measured as the baseline a user starts from, not as something to serve.
ENGINE_VARIANTS: dict[str, frozenset[Variant]] = {
    "onnxruntime": frozenset(Variant) - {Variant.NNCF_INT8, Variant.NNCF_ACCURACY},
    # FP16 is left out: OpenVINO picks its own precision, and the FP32 casts that keep the
    # file's inputs FP32 take the input names in OpenVINO's reading of the graph.
    "openvino": frozenset({Variant.FP32, Variant.INT8_STATIC, Variant.MIXED, Variant.NNCF_INT8,
                           Variant.NNCF_ACCURACY, Variant.QAT}),
    "torch": frozenset({Variant.FP32}),
}
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
TUNE_DEVICES = ("cpu", "cuda")  # what --devices names; the forms on each: search/devices.py
# Tune times many candidates x batch sizes, so each point gets a short, fixed budget
# (``TUNE_POINT_SECONDS``, at least ``min_runs`` runs) split over interleaved rounds
# (``TUNE_ROUNDS``) so that noise shows as a spread.
TUNE_MEASURE = MeasureSettings(min_runs=10, min_seconds=0.25)
TUNE_ROUNDS = 5
TUNE_POINT_SECONDS = 0.2


@dataclass(frozen=True)
class PruneRequest:
    """``sparsity``: fraction of channels removed; ``epochs``: distillation epochs after
    pruning (None keeps the pruner's default)."""

    sparsity: float
    epochs: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.sparsity < 1.0:
            raise ConfigError(f"--prune sparsity {self.sparsity:g} is not in (0, 1)")
        if self.epochs is not None and self.epochs < 0:
            raise ConfigError(f"--prune-epochs must be >= 0, got {self.epochs}")


@dataclass(frozen=True)
class TuneSettings:
    """What ``tune`` searches, under which SLO. The variants it searches over are built and
    judged by the optimizer under their own ``OptimizeSettings`` (``tune_optimize_settings``),
    whose budget is the tune's budget: the search reads only what is here."""

    slo_p99_ms: float
    engines: tuple[str, ...] = ()  # empty: every installed engine
    # cpu and/or cuda; empty: auto (cuda too when torch sees a GPU; search/devices.py)
    devices: tuple[str, ...] = ()
    threads: tuple[int, ...] = ()  # empty: 1 and every usable core
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    name: str | None = None  # repository entry name; default: the model's name
    prune: PruneRequest | None = None  # also try a pruned model, under the same budget
    rounds: int = TUNE_ROUNDS  # interleaved timing rounds over all candidates
    # Timing per candidate and batch size, split evenly over the rounds.
    point_seconds: float = TUNE_POINT_SECONDS
    # When no candidate meets the SLO, write the lowest-latency one anyway: off, so that
    # `tune && serve` never deploys a configuration that misses the SLO unasked.
    write_on_slo_miss: bool = False

    def __post_init__(self) -> None:
        if self.rounds < 1 or self.point_seconds < 0:
            raise ConfigError("tune needs at least one timing round and seconds >= 0")
        if self.slo_p99_ms <= 0:
            raise ConfigError("the p99 SLO must be > 0 ms")
        if not self.batch_sizes or min(self.batch_sizes) < 1:
            raise ConfigError("batch sizes must be positive integers")
        unknown = [e for e in self.engines if e not in ENGINE_VARIANTS]
        if unknown:
            raise ConfigError(f"unknown engine {unknown[0]!r}; known: "
                              f"{', '.join(ENGINE_VARIANTS)}")
        odd = [d for d in self.devices if d not in TUNE_DEVICES]
        if odd:
            raise ConfigError(f"unknown device {odd[0]!r}; choose from "
                              f"{', '.join(TUNE_DEVICES)} or auto")


def tune_settings_from(*, slo_p99_ms: float, engines: Sequence[str] | None = None,
                       devices: Sequence[str] | str | None = None,
                       batch_sizes: Sequence[int] | None = None,
                       threads: Sequence[int] | None = None, name: str | None = None,
                       prune: float | None = None, prune_epochs: int | None = None,
                       write_on_slo_miss: bool = False) -> TuneSettings:
    """The search's settings from the API keywords of ``tune``; None keeps a default."""
    return TuneSettings(
        slo_p99_ms=float(slo_p99_ms), engines=tuple(engines or ()),
        devices=parse_devices(devices), threads=tuple(threads or ()),
        batch_sizes=BATCH_SIZES if batch_sizes is None else tuple(batch_sizes), name=name,
        prune=None if prune is None else PruneRequest(float(prune), prune_epochs),
        write_on_slo_miss=write_on_slo_miss)


def parse_devices(devices: Sequence[str] | str | None) -> tuple[str, ...]:
    """``--devices``: a comma list or sequence of cpu, cuda; None or ``auto``: ()."""
    names = devices.split(",") if isinstance(devices, str) else list(devices or ())
    names = [n.strip().lower() for n in names if n.strip()]
    if names == ["auto"]:
        return ()
    if "auto" in names:
        raise ConfigError("--devices auto stands alone; or list the devices (cpu,cuda)")
    return tuple(dict.fromkeys(names))


def tune_optimize_settings(*, max_accuracy_drop: str | float,
                           variants: Sequence[str] | None = None, **data: Any
                           ) -> OptimizeSettings:
    """The settings of the optimizer run that builds and judges the variants ``tune``
    searches over: a budget is required, and every point is timed with ``TUNE_MEASURE``.
    ``data`` takes the data keywords of ``settings_from`` (``calib_data``, ``calib_count``,
    ``calib_images``, ``image_prep``, ``synthetic_calib``, ``eval_data``, ``metric``)."""
    optimize = settings_from(variants, max_accuracy_drop=max_accuracy_drop,
                             measure=TUNE_MEASURE, **data)
    check_tune_budget(optimize)
    return optimize


def check_tune_budget(optimize: OptimizeSettings) -> None:
    if optimize.budget is None:
        raise ConfigError("tune needs an accuracy budget")


def settings_from(variants: Sequence[str] | None = None, **fields: Any) -> OptimizeSettings:
    """Settings from API keywords, with the same parsing as the command line; keywords
    left as None keep the defaults of ``OptimizeSettings``."""
    values = {k: v for k, v in fields.items() if v is not None}
    if variants is not None:
        values["variants"] = parse_variants(list(variants))
    if "calibrations" in values:
        values["calibrations"] = parse_calibrations(list(values["calibrations"]))
    budget = values.pop("max_accuracy_drop", None)
    if budget is not None:
        values["budget"] = AccuracyBudget.parse(str(budget))
    for key in ("calib_data", "calib_images", "calib_text", "tokenizer", "train_data"):
        if key in values:
            values[key] = Path(values[key])
    if "eval_data" in values:
        values["eval_data"] = str(values["eval_data"])
    if "metric" in values:
        values["metric"] = _parse_enum(MetricKind, str(values["metric"]), "metric",
                                       tuple(MetricKind))
    return OptimizeSettings(**values)


def check_eval_data(ref: str) -> None:
    """An existing ``.npz`` file or folder, or a ``package.module:function`` hook."""
    path = Path(ref).expanduser()
    if path.is_dir() or (path.is_file() and path.suffix == ".npz"):
        return
    module, _, function = ref.partition(":")
    if function.isidentifier() and all(p.isidentifier() for p in module.split(".")):
        return
    raise ConfigError(f"--eval-data {ref}: expected an .npz file, a folder of .npy files or "
                      "package.module:function")


def parse_variants(names: tuple[str, ...] | list[str]) -> tuple[Variant, ...]:
    return tuple(_parse_enum(Variant, name, "variant", REQUESTABLE) for name in names)


def parse_calibrations(names: tuple[str, ...] | list[str]) -> tuple[CalibrationMethod, ...]:
    return tuple(
        _parse_enum(CalibrationMethod, name, "calibration method", tuple(CalibrationMethod))
        for name in names
    )


def _parse_enum(kind: type[E], name: str, what: str, allowed: tuple[E, ...]) -> E:
    try:
        value = kind(name.strip().lower())
    except ValueError:
        value = None
    if value is None or value not in allowed:
        choices = ", ".join(str(v.value) for v in allowed)
        raise ConfigError(f"unknown {what} {name!r}; choose from {choices}")
    return value
