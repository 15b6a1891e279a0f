"""``turboinfer profile``: per-operator time from the engine's own profiler."""

from __future__ import annotations

import argparse
from pathlib import Path

from turboinfer.commands._args import positive_int
from turboinfer.engines import EngineSettings
from turboinfer.models import resolve_model
from turboinfer.output import print_json
from turboinfer.profile import ProfileSettings, format_report, run_profile

NAME = "profile"
HELP = "per-operator time, framework overhead and QDQ share from the engine's own profiler"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="builtin:NAME, a path to an .onnx file, or a torch source")
    parser.add_argument("--engine", default="onnxruntime",
                        help="onnxruntime, openvino or torch")
    # A plain int: a bad batch size is the library's one-line error, like the others.
    parser.add_argument("--batch-size", type=int, default=1, help="rows per run")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads (0: the engine's choice)")
    parser.add_argument("--runs", type=positive_int, default=50,
                        help="profiled runs, averaged")
    parser.add_argument("--warmup", type=int, default=5, help="runs first, left out")
    parser.add_argument("--trace", type=Path, metavar="FILE.json",
                        help="write a chrome-trace of the profiled runs (opens in Perfetto)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    settings = ProfileSettings(engine=args.engine, batch_size=args.batch_size,
                               engine_settings=EngineSettings(intra_op_threads=args.threads),
                               runs=args.runs, warmup_runs=args.warmup)
    report = run_profile(resolve_model(args.model), settings, trace=args.trace)
    if args.json:
        print_json(report.to_dict())
    else:
        print(format_report(report))
    return 0
