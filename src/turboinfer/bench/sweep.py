"""The engine × batch-size sweep. An engine that cannot run the model (no torch module
behind an ONNX file, a missing optional engine, an op it does not support, an axis it
pins) is skipped with its reason and the others still run; what can be known without
loading anything is checked before the first timing starts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from turboinfer.bench.inputs import declared_inputs, random_feeds
from turboinfer.bench.latency import BenchConfig, BenchResult, measure
from turboinfer.bench.reasons import one_line, pinned_axis_hint
from turboinfer.engines import Session, TensorSpec, get_engine, load_session
from turboinfer.errors import MissingDependencyError
from turboinfer.models import ResolvedModel
from turboinfer.shapes import DeclaredInput, fixed_batch, resolve_shapes

Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class Skipped:
    """An engine, or one of its batch sizes (``batch_size`` set), that could not run."""

    engine: str
    reason: str
    batch_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "batch_size": self.batch_size, "reason": self.reason}


@dataclass(frozen=True)
class BenchReport:
    results: tuple[BenchResult, ...]
    skipped: tuple[Skipped, ...]


Step = BenchResult | Skipped


def run_bench(model: ResolvedModel, config: BenchConfig,
              on_step: Callable[[Step], None] | None = None) -> BenchReport:
    """Every (engine, batch size) pair, engines loaded once each, in the order given.

    Shape flags are checked against the model first: a wrong one is the user's error
    (``InvalidInputError``), not an engine's limit.
    """
    # onnx takes 0.3 s to import; `turboinfer --help` builds this command's parser.
    from turboinfer.models.onnx_file import check_onnx, input_specs

    specs = input_specs(check_onnx(model.artifact.onnx_path))
    declared = declared_inputs(specs)
    shapes = resolve_shapes(config.input_shapes, declared, model=model.name)
    steps: list[Step] = []

    def emit(step: Step) -> None:
        steps.append(step)
        if on_step is not None:
            on_step(step)

    runnable = _precheck(model, config, emit)
    feeds = _FeedCache(model, specs, shapes)
    for engine in runnable:
        _sweep_engine(engine, model, config, declared, feeds, emit)
    return BenchReport(tuple(s for s in steps if isinstance(s, BenchResult)),
                       tuple(s for s in steps if isinstance(s, Skipped)))


def _precheck(model: ResolvedModel, config: BenchConfig,
              emit: Callable[[Step], None]) -> list[str]:
    """The engines worth loading; the others are skipped before any timing starts."""
    runnable = []
    for engine in config.engines:
        reason = unmet_need(engine, model)
        if reason is None:
            runnable.append(engine)
        else:
            emit(Skipped(engine, reason))
    return runnable


def unmet_need(engine: str, model: ResolvedModel) -> str | None:
    """Why ``engine`` cannot run ``model``, when that is known without loading it."""
    if engine == "torch" and model.artifact.torch_module is None:
        # The torch engine runs the original module; an ONNX file has none behind it.
        return (f"the torch engine runs the PyTorch module and {model.name} is only an ONNX "
                f"file; bench a package.module:factory or a .pt2 file to include torch")
    try:
        get_engine(engine)
    except MissingDependencyError as exc:
        return str(exc)
    return None


def _sweep_engine(engine: str, model: ResolvedModel, config: BenchConfig,
                  declared: list[DeclaredInput], feeds: _FeedCache,
                  emit: Callable[[Step], None]) -> None:
    session = _load(engine, model, config)
    if isinstance(session, Skipped):
        emit(session)
        return
    fixed = fixed_batch(declared)
    ran: list[int] = []
    for batch_size in config.batch_sizes:
        if fixed is not None and batch_size != fixed:
            emit(Skipped(engine, f"{model.name} has no batch axis ({declared[0].describe()}): "
                                 f"it runs at batch size {fixed} only", batch_size))
            continue
        step = _measure(engine, session, feeds.get(batch_size), batch_size, config)
        if isinstance(step, Skipped):
            step = Skipped(engine, step.reason + pinned_axis_hint(batch_size, ran), batch_size)
        else:
            ran.append(batch_size)
        emit(step)


def _load(engine: str, model: ResolvedModel, config: BenchConfig) -> Session | Skipped:
    try:
        return load_session(model.artifact, engine, config.settings)
    except Exception as exc:  # an unsupported op, a setting it cannot honour, a user factory
        return Skipped(engine, one_line(exc))


def _measure(engine: str, session: Session, feeds: Feeds, batch_size: int,
             config: BenchConfig) -> Step:
    try:
        # One untimed run first: shapes were checked against the model, so a failure here
        # is this engine's limit (an axis it pins, a batch it cannot take), not the user's.
        session.run(feeds)
    except Exception as exc:  # engines raise their libraries' own errors for some failures
        return Skipped(engine, one_line(exc), batch_size)
    return measure(engine, session, feeds, batch_size, config)


class _FeedCache:
    """The same inputs for every engine at a batch size, made once."""

    def __init__(self, model: ResolvedModel, specs: list[TensorSpec],
                 shapes: dict[str, tuple[int, ...]]) -> None:
        self._model = model
        self._specs = specs
        self._shapes = shapes
        self._feeds: dict[int, Feeds] = {}

    def get(self, batch_size: int) -> Feeds:
        if batch_size not in self._feeds:
            self._feeds[batch_size] = self._make(batch_size)
        return self._feeds[batch_size]

    def _make(self, batch_size: int) -> Feeds:
        entry = self._model.entry
        if entry is not None and not self._shapes:
            return dict(entry.example_inputs(batch_size))
        return random_feeds(self._specs, batch_size, shapes=self._shapes)
