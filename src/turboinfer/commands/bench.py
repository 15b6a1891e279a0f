"""``turboinfer bench``: in-process latency and throughput per engine and batch size."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from turboinfer.bench.latency import BenchConfig, BenchResult
from turboinfer.bench.sweep import BenchReport, Skipped, Step, run_bench
from turboinfer.commands._args import (
    add_engine_settings,
    add_shape_argument,
    comma_list,
    engine_settings,
    positive_int,
    shape_flags,
)
from turboinfer.errors import ConfigError
from turboinfer.hardware import profile
from turboinfer.models import resolve_model
from turboinfer.output import format_table, print_json
from turboinfer.progress import ProgressDisplay

NAME = "bench"
HELP = "measure in-process latency and throughput per engine and batch size"

COLUMNS = ("engine", "batch_size", "p50_ms", "p90_ms", "p95_ms", "p99_ms", "mean_ms",
           "qps", "peak_rss_mb")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="builtin:NAME or a path to an .onnx file")
    parser.add_argument("--engines", type=comma_list(str), default=BenchConfig.engines,
                        help="comma list of onnxruntime, openvino, torch")
    parser.add_argument("--batch-sizes", type=comma_list(positive_int),
                        default=BenchConfig.batch_sizes, help="comma list, e.g. 1,8,32")
    parser.add_argument("--min-runs", type=positive_int, default=BenchConfig.min_runs,
                        help="timed runs at least, per engine and batch size")
    parser.add_argument("--min-seconds", type=float, default=BenchConfig.min_seconds,
                        help="timed seconds at least, per engine and batch size")
    parser.add_argument("--warmup", type=int, default=BenchConfig.warmup_runs,
                        help="untimed runs first")
    add_shape_argument(parser, "--batch-sizes")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_engine_settings(parser)


def run(args: argparse.Namespace) -> int:
    config = BenchConfig(
        engines=args.engines,
        batch_sizes=args.batch_sizes,
        settings=engine_settings(args, max_batch_size=max(args.batch_sizes)),
        min_runs=args.min_runs,
        min_seconds=args.min_seconds,
        warmup_runs=args.warmup,
        input_shapes=shape_flags(args),
    )
    model = resolve_model(args.model)
    with ProgressDisplay() as display:
        report = run_bench(model, config, on_step=_reporter(display, config))
    if not report.results:
        # Nothing measured: one line with every reason, and no half-empty report.
        reasons = "; ".join(_skip_line(s) for s in report.skipped)
        raise ConfigError(f"no engine could run {model.name}: {reasons}")
    _print(args, model.name, report)
    return 0


def _print(args: argparse.Namespace, model: str, report: BenchReport) -> None:
    rows = [r.to_dict() for r in report.results]
    machine = profile().summary()
    if args.json:
        print_json({"model": model, "machine": machine, "results": rows,
                    "skipped": [s.to_dict() for s in report.skipped]})
        return
    print(f"model: {model}")
    print(f"machine: {machine.get('cpu', '?')}, {machine.get('logical_cores', '?')} logical cores")
    print(format_table(COLUMNS, [[row[c] for c in COLUMNS] for row in rows]))
    for skipped in report.skipped:
        print(f"skipped {_skip_line(skipped)}")


def _skip_line(skipped: Skipped) -> str:
    where = skipped.engine if skipped.batch_size is None else (
        f"{skipped.engine} batch {skipped.batch_size}")
    return f"{where}: {skipped.reason}"


def _reporter(display: ProgressDisplay, config: BenchConfig) -> Callable[[Step], None]:
    """Counts finished (engine, batch size) pairs into the display; a skipped engine
    finishes all of its batch sizes at once."""
    total = len(config.engines) * len(config.batch_sizes)
    done = 0

    def report(step: Step) -> None:
        nonlocal done
        if isinstance(step, BenchResult):
            done += 1
            message = (f"{step.engine} batch {step.batch_size}: "
                       f"p50 {step.latency.p50_ms:.2f} ms")
        else:
            done += len(config.batch_sizes) if step.batch_size is None else 1
            message = f"skipped {_skip_line(step)}"
        display.step_done(message, done=done, total=total)

    return report
