"""OpenVINO's own INT8: NNCF post-training quantization, for models OpenVINO will run.

A QDQ model written for ONNX Runtime runs on OpenVINO, but OpenVINO's quantizer places
its fake-quantize nodes where its CPU plugin fuses them, which is measurably faster
there. So when ``tune`` has openvino among its engines and int8-static among its
variants, two more variants join the search, each saved as OpenVINO IR (``.xml`` with
its ``.bin``) and run only on openvino (``settings.ENGINE_VARIANTS``):

- ``nncf-int8``: ``nncf.quantize`` on the OpenVINO model read from the ONNX file, with
  the same calibration samples the int8-static variants use (all of them, one per item);
- ``nncf-accuracy``: ``nncf.quantize_with_accuracy_control``, which keeps the layers that
  cost most accuracy in float until the tune's budget holds, validated with the metric
  and evaluation data the optimizer judges every variant with. Skipped when nncf-int8
  already meets the budget (it would return the same model) or when there is no metric.

Both are judged like any variant: metric on the evaluation set and batch-1 latency, on
the openvino engine.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from turboinfer.engines import EngineSettings
from turboinfer.models import ResolvedModel
from turboinfer.models.onnx_file import check_onnx, input_specs
from turboinfer.optimize.builders.logs import quiet
from turboinfer.optimize.data.calibration import CalibrationSet
from turboinfer.optimize.judge.judging import judge_and_calibration
from turboinfer.optimize.judge.measure import Judge, file_size, latency_of, metric_of
from turboinfer.optimize.report import OptimizeReport, VariantResult
from turboinfer.optimize.settings import AccuracyBudget, OptimizeSettings, Variant

ENGINE = "openvino"


@dataclass(frozen=True)
class NncfJob:
    """What both NNCF variants read: the float model, calibration data, judge, budget."""

    source: Path
    out: Path
    calib: CalibrationSet
    judge: Judge
    budget: AccuracyBudget | None
    reference: float | None  # the FP32 metric every variant is compared with

    @property
    def transformer(self) -> bool:
        return is_transformer(onnx.load(str(self.source), load_external_data=False))


def wanted(settings: OptimizeSettings, engines: Iterable[str], report: OptimizeReport) -> bool:
    """NNCF variants join when openvino runs candidates and static INT8 was built."""
    return (ENGINE in engines and Variant.INT8_STATIC in settings.variants
            and report.best_static() is not None)


def add_nncf_variants(resolved: ResolvedModel, report: OptimizeReport,
                      settings: OptimizeSettings) -> OptimizeReport:
    """``report`` with the NNCF variants judged and appended (or a note on why not)."""
    if importlib.util.find_spec("nncf") is None:
        return report.with_notes("nncf is not installed: no OpenVINO-native INT8 variants "
                                 "(pip install 'turboinfer[openvino]')")
    job = _job(resolved, report, settings)
    plain = _judge_ir("nncf-int8", Variant.NNCF_INT8, quantize_nncf(job), job)
    results = [plain]
    if plain.within_budget is True:
        results.append(VariantResult("nncf-accuracy", Variant.NNCF_ACCURACY,
                                     skipped="nncf-int8 already meets the budget"))
    elif job.budget is None or job.reference is None or not job.judge.has_metric:
        results.append(VariantResult("nncf-accuracy", Variant.NNCF_ACCURACY,
                                     skipped="no metric and budget to control"))
    else:
        results.append(_judge_ir("nncf-accuracy", Variant.NNCF_ACCURACY,
                                 quantize_accuracy_control(job), job))
    updated = replace(report, variants=(*report.variants, *results))
    updated.write()
    return updated


def _job(resolved: ResolvedModel, report: OptimizeReport,
         settings: OptimizeSettings) -> NncfJob:
    """The same judge and calibration samples as the optimizer's run, timed on openvino."""
    source = Path(resolved.artifact.onnx_path)
    judge, calib = judge_and_calibration(resolved, source, input_specs(check_onnx(source)),
                                         settings, calibrate=True)
    assert calib is not None  # asked for with calibrate=True
    judge = replace(judge, settings=replace(settings.measure, engine=ENGINE))
    return NncfJob(source, report.output_dir, calib, judge, settings.budget,
                   report.reference.metric)


def quantize_nncf(job: NncfJob) -> Path:
    # why: nncf and openvino are optional extras, imported only when NNCF variants are built.
    import nncf
    import openvino as ov

    model = ov.Core().read_model(str(job.source))
    with _silent():
        quantized = nncf.quantize(model, nncf.Dataset(_samples(job.calib)),
                                  subset_size=job.calib.count, model_type=_model_type(job))
    return _save(quantized, job.out / "nncf-int8.xml")


def quantize_accuracy_control(job: NncfJob) -> Path:
    # why: nncf and openvino are optional extras, imported only when NNCF variants are built.
    import nncf
    import openvino as ov

    assert job.budget is not None and job.reference is not None
    model = ov.Core().read_model(str(job.source))
    # One item standing for the whole evaluation set: the evaluator owns its data, so
    # every validation (and every layer ranking) is on all of it.
    validation = nncf.Dataset([job.calib.slice(0, 1)])
    restorer = nncf.AdvancedAccuracyRestorerParameters(num_ranking_workers=1)
    with _silent():
        quantized = nncf.quantize_with_accuracy_control(
            model, nncf.Dataset(_samples(job.calib)), validation, _validator(job),
            max_drop=job.budget.allowed_drop(job.reference), drop_type=nncf.DropType.ABSOLUTE,
            subset_size=job.calib.count, model_type=_model_type(job),
            advanced_accuracy_restorer_parameters=restorer)
    return _save(quantized, job.out / "nncf-accuracy.xml")


def is_transformer(model: onnx.ModelProto) -> bool:
    """Attention present: a Softmax whose output feeds a MatMul (scores times values)."""
    softmax_out = {o for n in model.graph.node if n.op_type == "Softmax" for o in n.output}
    return any(n.op_type == "MatMul" and softmax_out.intersection(n.input)
               for n in model.graph.node)


def _model_type(job: NncfJob) -> Any:
    # why: nncf is an optional extra; this module imports without it.
    import nncf

    return nncf.ModelType.TRANSFORMER if job.transformer else None


def _samples(calib: CalibrationSet) -> list[dict[str, np.ndarray]]:
    """One item per calibration sample, batch axis kept: NNCF counts items in subset_size."""
    return [calib.slice(i, i + 1) for i in range(calib.count)]


def _validator(job: NncfJob) -> Any:
    """NNCF's validation function: the judge's metric, signed so that higher is better,
    as NNCF assumes."""
    # why: the adapter imports openvino, an optional extra.
    from turboinfer.engines.openvino import OpenVinoSession

    evaluator = job.judge.evaluator
    assert evaluator is not None
    sign = 1.0 if evaluator.higher_is_better else -1.0

    def validate(compiled: Any, items: Iterable[Any]) -> tuple[float, None]:
        return sign * float(evaluator.compute(OpenVinoSession(compiled).run)), None

    return validate


def _save(model: Any, path: Path) -> Path:
    # why: openvino is an optional extra.
    import openvino as ov

    # FP32 weights stay FP32: the default FP16 compression would move layers kept in
    # float for accuracy away from the float model.
    ov.save_model(model, str(path), compress_to_fp16=False)
    return path


def _judge_ir(name: str, variant: Variant, path: Path, job: NncfJob) -> VariantResult:
    """Metric, delta, budget verdict and batch-1 latency, all on openvino."""
    metric = metric_of(path, job.judge, ENGINE)
    delta = within = None
    if metric is not None and job.reference is not None:
        delta = metric - job.reference
        if job.budget is not None:
            within = job.budget.meets(job.reference, metric, job.judge.higher_is_better)
    size = file_size(path) + path.with_suffix(".bin").stat().st_size
    return VariantResult(name, variant, path, size, metric, delta, within,
                         latency_of(path, job.judge, EngineSettings()),
                         details={"engine": ENGINE, "format": "OpenVINO IR",
                                  "calibration_samples": job.calib.count,
                                  "transformer": job.transformer,
                                  "fake_quantize_ops": fake_quantize_ops(path)})


def fake_quantize_ops(path: Path) -> int:
    """Quantized points left in an IR: fewer in nncf-accuracy means layers kept in float."""
    # why: openvino is an optional extra.
    import openvino as ov

    return sum(op.get_type_name() == "FakeQuantize"
               for op in ov.Core().read_model(str(path)).get_ops())


@contextlib.contextmanager
def _silent() -> Iterator[None]:
    """NNCF draws progress bars on stdout (which belongs to --json) and logs every step."""
    logger = logging.getLogger("nncf")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with quiet():
            yield
    finally:
        logger.setLevel(level)
