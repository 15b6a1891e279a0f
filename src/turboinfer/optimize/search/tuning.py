"""The tuner behind ``tune`` (the module is not named tune.py so that it cannot shadow
the package's ``tune`` function once imported).

Variants x engines x threads x batch sizes, under a p99 SLO and an accuracy
budget; the winner becomes a model-repository entry with derived batching settings.

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

from turboinfer.bench.latency import feeds_for
from turboinfer.bench.reasons import one_line
from turboinfer.engines import (
    EngineSettings,
    ModelArtifact,
    Session,
    available_engines,
    load_session,
)
from turboinfer.models import ResolvedModel
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
    sources: list[tuple[OptimizeReport, ResolvedModel]] = [(report, resolved)]
    pruned = (None if settings.prune is None else
              build_pruned(resolved, report, work, settings.prune, optimize, say))
    if pruned is not None:
        sources.append((pruned.report, pruned.resolved))
    measured = _measure_all(sources, report, optimize.measure, settings, say)
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
                       pruning=None if pruned is None else pruned.to_dict())
    tuned.write()
    return tuned


def _measure_all(sources: list[tuple[OptimizeReport, ResolvedModel]], reference: OptimizeReport,
                 measure: MeasureSettings, settings: TuneSettings, say: Progress
                 ) -> list[Measured]:
    """Every candidate of every source model, judged on engines against ``reference``,
    loaded first and then timed in interleaved rounds."""
    planned = [(c, source) for report, source in sources
               for c in _candidates(report, source, settings)]
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


def _candidates(report: OptimizeReport, resolved: ResolvedModel,
                settings: TuneSettings) -> Iterator[Candidate]:
    engines = _engines(settings)
    threads = settings.threads or _default_threads(report)
    for result in _benchmarked(report):
        for engine in engines:
            if result.variant not in ENGINE_VARIANTS[engine] or result.path is None:
                continue
            if engine == "torch" and resolved.artifact.torch_module is None:
                continue
            for count in threads:
                yield Candidate(result.name, result.variant, result.path, engine, count,
                                result.metric, result.within_budget)


def _engines(settings: TuneSettings) -> tuple[str, ...]:
    return settings.engines or tuple(e for e in ENGINE_VARIANTS if e in available_engines())


def _default_threads(report: OptimizeReport) -> tuple[int, ...]:
    cores = int(report.machine.get("usable_cores") or 1)
    return tuple(sorted({1, cores}))


def _load(candidate: Candidate, resolved: ResolvedModel, report: OptimizeReport,
          batch_sizes: tuple[int, ...], cache: dict[tuple[str, int], Feeds]
          ) -> tuple[Candidate, Timed | None, str | None]:
    """The candidate's session, its metric on its engine, and its batch sizes to time."""
    artifact = ModelArtifact(resolved.name, candidate.path,
                             resolved.artifact.torch_module if candidate.engine == "torch"
                             else None)
    try:
        session = load_session(artifact, candidate.engine,
                               EngineSettings(intra_op_threads=candidate.threads))
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


def _engine_metric(candidate: Candidate, session: Session, report: OptimizeReport
                   ) -> Candidate:
    """The metric on this engine, under the budget ``report`` was judged with: engines
    differ in int8 kernels and fused ops, so a variant judged on ORT is judged again
    where it would run."""
    if candidate.engine == "onnxruntime" or report.evaluate is None or report.metric is None:
        return candidate
    value = float(report.evaluate(session.run))
    reference = report.reference.metric
    within = (None if reference is None or report.budget is None else
              report.budget.meets(reference, value, report.metric.higher_is_better))
    return replace(candidate, metric=value, within_budget=within)
