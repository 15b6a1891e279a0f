"""What a model's variants are judged on, decided once per run: the zoo's metric, the
user's evaluation data, or — when a budget is asked for and no labels are given —
fidelity to the FP32 model on calibration samples held out for it. A budget with
nothing to measure against is an error, never a silent pass.
"""

from __future__ import annotations

from pathlib import Path

from turboinfer.engines.base import TensorSpec
from turboinfer.errors import ConfigError
from turboinfer.models import ResolvedModel
from turboinfer.models.metrics import BATCH
from turboinfer.models.zoo import EvalSet
from turboinfer.optimize.data.calibration import CalibrationSet, load_calibration
from turboinfer.optimize.judge.evaluation import Evaluator, user_evaluator, zoo_evaluator
from turboinfer.optimize.judge.fidelity import fidelity_evaluator
from turboinfer.optimize.judge.measure import Judge, open_session
from turboinfer.optimize.settings import OptimizeSettings

NOTHING_TO_MEASURE = (
    "--max-accuracy-drop has nothing to measure against for this model: pass --eval-data "
    "(inputs and labels, or package.module:function), --calib-data, --calib-images or "
    "--calib-text (part is held out to compare with the FP32 model), or --synthetic-calib")


def eval_batch(specs: list[TensorSpec]) -> int:
    """Samples per run when scoring: many when every input's batch axis is dynamic."""
    dynamic = all(spec.shape and not isinstance(spec.shape[0], int) for spec in specs)
    return BATCH if dynamic else 1


def judge_and_calibration(resolved: ResolvedModel, source: Path, specs: list[TensorSpec],
                          settings: OptimizeSettings, *, calibrate: bool
                          ) -> tuple[Judge, CalibrationSet | None]:
    """The judge of every variant, and the calibration set when ``calibrate`` asks for
    one or the fidelity check needs held-out samples."""
    entry = resolved.entry
    evalset = entry.evaluation() if entry is not None else None
    evaluator = _labelled(resolved, source, specs, settings, evalset)
    fidelity = evaluator is None and settings.budget is not None
    if fidelity and not _has_inputs(resolved, settings):
        raise ConfigError(NOTHING_TO_MEASURE)
    calib = None
    if calibrate or fidelity:
        calib = load_calibration(entry, specs, settings, model_path=source, hold_out=fidelity)
    if fidelity and calib is not None and calib.held_out is not None:
        reference = open_session(source)
        evaluator = fidelity_evaluator(reference.run, calib.held_out,
                                       output=reference.outputs[0].name,
                                       batch=eval_batch(specs), source=calib.source)
    feeds = entry.example_inputs(1) if entry is not None else None
    judge = Judge(entry, evalset, feeds, settings.measure, evaluator)
    return judge, (calib if calibrate else None)


def _labelled(resolved: ResolvedModel, source: Path, specs: list[TensorSpec],
              settings: OptimizeSettings, evalset: EvalSet | None) -> Evaluator | None:
    if settings.eval_data is not None:
        reference = open_session(source)
        return user_evaluator(settings.eval_data, settings.metric, specs, reference.run,
                              eval_batch(specs))
    if resolved.entry is not None and evalset is not None:
        return zoo_evaluator(resolved.entry, evalset)
    return None


def _has_inputs(resolved: ResolvedModel, settings: OptimizeSettings) -> bool:
    return (settings.calib_data is not None or settings.calib_images is not None
            or settings.calib_text is not None or settings.synthetic_calib
            or resolved.entry is not None)
