"""``turboinfer optimize``: one ONNX file per variant plus report.json, judged against FP32."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from turboinfer.commands._args import comma_list, positive_int
from turboinfer.commands._data_args import add_data_arguments, data_keywords
from turboinfer.output import format_table, print_json
from turboinfer.progress import ProgressDisplay

NAME = "optimize"
HELP = "write graph/fp16/int8/int4 variants of a model with accuracy and latency per variant"

# OptimizeSettings' defaults, repeated (tests check they agree): importing anything from
# turboinfer.optimize loads onnx and onnxruntime, too slow for `turboinfer --help`.
VARIANTS = ("graph", "fp16", "int8-dynamic", "int8-static", "int4")
CALIBRATIONS = ("minmax", "entropy", "percentile")
CALIB_COUNT = 500

COLUMNS = ("variant", "metric", "delta", "budget", "p50_ms", "p99_ms", "size_kb", "note")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="builtin:NAME, an .onnx file, or a source export reads")
    parser.add_argument("-o", "--output", type=Path, required=True, help="output folder")
    parser.add_argument("--variants", type=comma_list(str),
                        default=VARIANTS,
                        help="comma list of graph, fp16, int8-dynamic, int8-static, int4, qat "
                             "(quantization-aware training: asked for only)")
    parser.add_argument("--calibration", type=comma_list(str),
                        default=CALIBRATIONS,
                        help="comma list of minmax, entropy, percentile (int8-static)")
    parser.add_argument("--calib-count", type=positive_int, default=CALIB_COUNT,
                        help="calibration samples")
    parser.add_argument("--sensitivity", action="store_true",
                        help="rank layers by the quantization noise they add")
    parser.add_argument("--max-accuracy-drop", metavar="X",
                        help="budget in metric points, or X%% relative: keeps sensitive layers "
                             "in float until int8 meets it")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_data_arguments(parser)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: turboinfer.optimize loads onnx and onnxruntime (slow --help).
    from turboinfer.optimize import optimize
    from turboinfer.optimize.pipeline import settings_from

    settings = settings_from(
        args.variants, calibrations=args.calibration, calib_count=args.calib_count,
        sensitivity=args.sensitivity, max_accuracy_drop=args.max_accuracy_drop,
        **data_keywords(args))
    with ProgressDisplay() as display:
        report = optimize(args.model, args.output, settings=settings, progress=display.stage)
    if args.json:
        print_json(report.to_dict())
        return 0
    _print_report(report)
    return 0


def _print_report(report: Any) -> None:
    metric = report.metric
    print(f"model: {report.model}" + (f"  metric: {metric.name} ({metric.unit})"
                                      if metric else "  metric: none"))
    if metric is not None and metric.description:
        print(f"measured: {metric.description}")
    if report.activation is not None:
        act = report.activation
        print(f"int8 activations: {act.chosen.value} ({act.reason})")
    print(format_table(COLUMNS, [_row(v) for v in report.variants]))
    if report.sensitivity:
        print("\nmost sensitive layers (SQNR lost across the layer, dB):")
        rows = [[s.node, s.op_type, s.loss_db if s.loss_db is not None else "-",
                 s.sqnr_db if s.sqnr_db is not None else "-"] for s in report.sensitivity[:10]]
        print(format_table(("layer", "op", "loss_db", "sqnr_db"), rows))
    if report.mixed is not None:
        print(f"\nmixed precision: {report.mixed.reason}")
    for note in report.notes:
        print(f"note: {note}")
    print(f"report: {report.output_dir / 'report.json'}")


def _row(v: Any) -> list[Any]:
    lat = v.latency
    budget = {True: "ok", False: "over", None: "-"}[v.within_budget]
    return [v.name, "-" if v.metric is None else v.metric,
            "-" if v.delta is None else v.delta, budget,
            lat.p50_ms if lat else "-", lat.p99_ms if lat else "-",
            "-" if v.size_bytes is None else v.size_bytes / 1024, v.skipped or ""]
