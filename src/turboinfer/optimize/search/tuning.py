"""The tuner behind ``tune`` (the module is not named tune.py so that it cannot shadow
the package's ``tune`` function once imported).

Variants x engines x devices and forms x threads x batch sizes, under a p99 SLO and an
accuracy budget; the winner becomes a model-repository entry with derived batching
settings that says where it runs. The device axis (which devices, which forms on each)
is ``devices.py``; a form's metric is measured on its device and judged under the budget
here (``_engine_metric``), its latency timed on its device's clock (``rounds.py``).

What keeps it to minutes on two cores: all int8-static calibrations are judged for
accuracy but only the best one is benchmarked (they run at the same speed), batch
sizes stop growing once p99 passes the SLO beyond the noise, and each point gets a
fixed, short budget of time.

What keeps the decision stable on a shared machine: that budget is split over
interleaved rounds (``rounds.py``), every point gets a median and an interval over
rounds, and a candidate misses the SLO or loses on throughput only beyond that noise;
between candidates within noise the simpler one wins (``choice.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import onnx

from turboinfer.bench.latency import feeds_for
from turboinfer.bench.reasons import one_line
from turboinfer.engines import (
    EngineSettings,
    ModelArtifact,
    Session,
    Toggle,
    available_engines,
    load_session,
)
from turboinfer.hardware import has_fast_bf16, profile
from turboinfer.models import ResolvedModel
from turboinfer.models.onnx_file import input_specs
from turboinfer.optimize.builders.nncf_variants import add_nncf_variants
from turboinfer.optimize.builders.nncf_variants import wanted as nncf_wanted
from turboinfer.optimize.pipeline import (
    ModelRef,
    Progress,
    ensure_writable,
    resolve,
    run_optimize,
)
from turboinfer.optimize.report import OptimizeReport, VariantResult
from turboinfer.optimize.search.batching import plan_batching
from turboinfer.optimize.search.candidates import Candidate, Measured
from turboinfer.optimize.search.choice import annotate, choose
from turboinfer.optimize.search.devices import (
    Search,
    ort_gpu_devices,
    placements,
    resolve_devices,
    torch_source,
)
from turboinfer.optimize.search.rounds import Feeds, Point, Timed, Windows, run_rounds
from turboinfer.optimize.search.tune_prune import build_pruned, check_prunable
from turboinfer.optimize.search.tune_report import TuneReport, write_entry_for
from turboinfer.optimize.settings import (
    ENGINE_VARIANTS,
    MeasureSettings,
    OptimizeSettings,
    TuneSettings,
    Variant,
    check_tune_budget,
)


def run_tune(model: ModelRef, repo: Path, optimize: OptimizeSettings, settings: TuneSettings,
             progress: Progress | None = None) -> TuneReport:
    """Build and judge the variants under ``optimize`` (its budget is the tune's), then
    search them under ``settings``."""
    say = progress or (lambda message: None)
    started = time.perf_counter()
    check_tune_budget(optimize)
    search = _search(settings)  # cuda asked for on a machine without: an error, now
    resolved = resolve(model)
    if settings.prune is not None:
        check_prunable(resolved)
    name = settings.name or resolved.name.replace("/", "-")
    work = ensure_writable(Path(repo) / name / "tune")
    say("building variants")
    report = run_optimize(resolved, work / "variants", optimize, say)
    if nncf_wanted(optimize, _engines(settings), report):
        say("building OpenVINO INT8 variants with NNCF")
        report = add_nncf_variants(resolved, report, optimize)
    source = torch_source(model, resolved)
    sources: list[Source] = [(report, resolved, source)]
    pruned = (None if settings.prune is None else
              build_pruned(resolved, report, work, settings.prune, optimize, say))
    if pruned is not None:
        sources.append((pruned.report, pruned.resolved, None))
    measured = _measure_all(sources, report, optimize.measure, settings, search, say)
    decision = choose(measured)
    measured = annotate(measured, decision)
    chosen = None if decision is None else decision.chosen
    entry = None
    if chosen is not None and (measured[chosen].eligible or settings.write_on_slo_miss):
        entry = write_entry_for(Path(repo), name, measured[chosen])
    tuned = TuneReport(model=resolved.name, name=name, settings=settings,
                       candidates=tuple(measured), chosen=chosen, entry=entry,
                       optimize=report, work=work,
                       elapsed_s=time.perf_counter() - started,
                       pruning=None if pruned is None else pruned.to_dict(),
                       devices=search.devices,
                       search_notes=tuple(search.notes(source is not None)))
    tuned.write()
    return tuned


# A model the candidates come from: its optimizer report, the model, and the PyTorch
# source a torch entry would name (None: torch candidates are baselines, not served).
Source = tuple[OptimizeReport, ResolvedModel, str | None]


def _search(settings: TuneSettings) -> Search:
    devices = resolve_devices(settings.devices)
    gpu = "cuda" in devices
    return Search(devices, torch_named="torch" in settings.engines,
                  fast_bf16=has_fast_bf16(profile(engines=False, gpus=False)),
                  ort_gpu=ort_gpu_devices() if gpu else ())


def _measure_all(sources: list[Source], reference: OptimizeReport, measure: MeasureSettings,
                 settings: TuneSettings, search: Search, say: Progress) -> list[Measured]:
    """Every candidate of every source model, judged on engines against ``reference``,
    loaded first and then timed in interleaved rounds."""
    planned = [(c, resolved) for report, resolved, source in sources
               for c in _candidates(report, resolved, source, settings, search)]
    feeds: dict[tuple[str, int], Feeds] = {}
    loaded: list[tuple[Candidate, Timed | None, str | None]] = []
    for index, (candidate, source) in enumerate(planned, 1):
        say(f"[{index}/{len(planned)}] loading {candidate.label}")
        loaded.append(_load(candidate, source, reference, settings.batch_sizes, feeds))
    windows = Windows.split(measure, settings.rounds,
                            settings.point_seconds, settings.slo_p99_ms)
    run_rounds([t for _, t, _ in loaded if t is not None], windows, say)
    return [_result(candidate, timed, error, settings) for candidate, timed, error in loaded]


def _benchmarked(report: OptimizeReport) -> list[VariantResult]:
    """Usable variants, with the int8-static calibrations reduced to the most accurate."""
    best = report.best_static()
    return [v for v in report.usable()
            if v.variant is not Variant.INT8_STATIC or v is best]


def _candidates(report: OptimizeReport, resolved: ResolvedModel, source: str | None,
                settings: TuneSettings, search: Search) -> Iterator[Candidate]:
    engines = _engines(settings)
    threads = settings.threads or _default_threads(report)
    specs = input_specs(onnx.load(str(resolved.artifact.onnx_path), load_external_data=False))
    for result in _benchmarked(report):
        for engine in engines:
            if result.variant not in ENGINE_VARIANTS[engine] or result.path is None:
                continue
            if engine == "torch" and resolved.artifact.torch_module is None:
                continue
            for place in placements(engine, result.variant, search, specs,
                                    source is not None):
                # On a GPU the host threads only feed it: one count, the smallest.
                for count in threads if place.device == "cpu" else threads[:1]:
                    yield Candidate(result.name, result.variant, result.path, engine, count,
                                    result.metric, result.within_budget, place,
                                    source if engine == "torch" else None)


def _engines(settings: TuneSettings) -> tuple[str, ...]:
    return settings.engines or tuple(e for e in ENGINE_VARIANTS if e in available_engines())


def _default_threads(report: OptimizeReport) -> tuple[int, ...]:
    cores = int(report.machine.get("usable_cores") or 1)
    return tuple(sorted({1, cores}))


def _settings(candidate: Candidate, batch_sizes: tuple[int, ...]) -> EngineSettings:
    """The engine settings the candidate loads with; CUDA graphs are captured for buckets
    up to the largest batch size timed."""
    return candidate.placement.engine_settings(candidate.threads, max(batch_sizes))


def _load(candidate: Candidate, resolved: ResolvedModel, report: OptimizeReport,
          batch_sizes: tuple[int, ...], cache: dict[tuple[str, int], Feeds]
          ) -> tuple[Candidate, Timed | None, str | None]:
    """The candidate's session, its metric on its engine, and its batch sizes to time."""
    artifact = ModelArtifact(resolved.name, candidate.path,
                             resolved.artifact.torch_module if candidate.engine == "torch"
                             else None)
    try:
        session = load_session(artifact, candidate.engine,
                               _settings(candidate, batch_sizes))
        candidate = _resolved_form(candidate, session)
        candidate = _engine_metric(candidate, session, report)
    except Exception as exc:  # an engine that cannot load or run it: this candidate only
        return candidate, None, one_line(exc)

    def feeds(batch: int) -> Feeds:
        # Every variant of one source takes the same inputs: build each batch once.
        key = (resolved.name, batch)
        if key not in cache:
            cache[key] = feeds_for(resolved, session, batch, {})
        return cache[key]

    points = [Point(batch) for batch in sorted(batch_sizes)]
    return candidate, Timed(session, points, feeds), None


def _result(candidate: Candidate, timed: Timed | None, error: str | None,
            settings: TuneSettings) -> Measured:
    if timed is None or timed.error is not None:
        return Measured(candidate, error=error or (timed.error if timed else None))
    curve = timed.curve()
    return Measured(candidate, curve, plan_batching(curve, settings.slo_p99_ms),
                    notes=tuple(timed.notes))


def _resolved_form(candidate: Candidate, session: Session) -> Candidate:
    """``channels_last: auto`` as the torch engine resolved it for this model and form,
    so that the label and the entry say what was measured."""
    form = getattr(session, "form", None)
    if (candidate.engine != "torch" or not isinstance(form, dict)
            or candidate.placement.channels_last is not Toggle.AUTO):
        return candidate
    layout = Toggle.ON if form.get("channels_last") else Toggle.OFF
    return replace(candidate, placement=replace(candidate.placement, channels_last=layout))


def _engine_metric(candidate: Candidate, session: Session, report: OptimizeReport
                   ) -> Candidate:
    """The metric on this engine, device and form, under the budget ``report`` was
    judged with: engines differ in int8 kernels and fused ops, and FP16/BF16/TF32 round
    differently on each device, so a variant judged on ORT on the CPU is judged again
    where and as it would run, exactly as INT8 is."""
    judged_as_is = candidate.engine == "onnxruntime" and candidate.placement.plain
    if judged_as_is or report.evaluate is None or report.metric is None:
        return candidate
    value = float(report.evaluate(session.run))
    reference = report.reference.metric
    within = (None if reference is None or report.budget is None else
              report.budget.meets(reference, value, report.metric.higher_is_better))
    return replace(candidate, metric=value, within_budget=within)
