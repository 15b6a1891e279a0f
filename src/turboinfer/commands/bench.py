"""``turboinfer bench``: in-process latency and throughput per engine and batch size."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from turboinfer.bench.latency import BenchConfig, BenchResult, run_bench
from turboinfer.commands._args import (
    add_engine_settings,
    comma_list,
    engine_settings,
    input_shape,
    positive_int,
)
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
    parser.add_argument("--input-shape", type=input_shape, action="append", default=[],
                        metavar="NAME=D1xD2",
                        help="shape of an input with dynamic axes (batch axis excluded)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_engine_settings(parser)


def run(args: argparse.Namespace) -> int:
    config = BenchConfig(
        engines=args.engines,
        batch_sizes=args.batch_sizes,
        settings=engine_settings(args),
        min_runs=args.min_runs,
        min_seconds=args.min_seconds,
        warmup_runs=args.warmup,
        input_shapes=dict(args.input_shape),
    )
    model = resolve_model(args.model)
    with ProgressDisplay() as display:
        results = run_bench(model, config, on_result=_reporter(display, config))
    rows = [r.to_dict() for r in results]
    machine = profile().summary()
    if args.json:
        print_json({"model": model.name, "machine": machine, "results": rows})
        return 0
    print(f"model: {model.name}")
    print(f"machine: {machine.get('cpu', '?')}, {machine.get('logical_cores', '?')} logical cores")
    print(format_table(COLUMNS, [[row[c] for c in COLUMNS] for row in rows]))
    return 0


def _reporter(display: ProgressDisplay, config: BenchConfig) -> Callable[[BenchResult], None]:
    """Counts finished (engine, batch size) pairs into the display."""
    total = len(config.engines) * len(config.batch_sizes)
    done = 0

    def report(result: BenchResult) -> None:
        nonlocal done
        done += 1
        display.step_done(f"{result.engine} batch {result.batch_size}: "
                          f"p50 {result.latency.p50_ms:.2f} ms", done=done, total=total)

    return report
