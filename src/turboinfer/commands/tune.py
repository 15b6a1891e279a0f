"""``turboinfer tune``: the fastest configuration inside a p99 SLO and an accuracy budget,
written as a model-repository entry for ``turboinfer serve``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from turboinfer.commands._args import comma_list, positive_int
from turboinfer.commands._data_args import add_data_arguments, data_keywords
from turboinfer.output import format_table, print_json
from turboinfer.progress import ProgressDisplay

if TYPE_CHECKING:  # the module loads onnx: only for the annotation
    from turboinfer.optimize.search.tune_report import TuneReport

# Exit codes beyond the usual 0 / 2: nothing servable ran, or no candidate met the SLO.
EXIT_NOTHING_RAN = 1
EXIT_SLO_MISSED = 3

NAME = "tune"
HELP = "search variants x engines x settings under a latency SLO and accuracy budget"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="builtin:NAME, an .onnx file, or a source export reads")
    parser.add_argument("--slo-p99-ms", type=float, required=True,
                        help="p99 latency target per request, in ms")
    parser.add_argument("--max-accuracy-drop", required=True, metavar="X",
                        help="allowed metric drop vs FP32: points, or X%% relative")
    parser.add_argument("-o", "--output", type=Path, required=True,
                        help="model repository folder (REPO/<name>/config.yaml, 1/model.onnx)")
    parser.add_argument("--engines", type=comma_list(str),
                        help="comma list of onnxruntime, openvino, torch (default: installed)")
    parser.add_argument("--devices", type=comma_list(str), metavar="LIST",
                        help="comma list of cpu, cuda, or auto (default: auto, cuda too "
                             "when torch sees a GPU): the devices candidates run on")
    parser.add_argument("--variants", type=comma_list(str),
                        help="comma list (default: graph,fp16,int8-dynamic,int8-static,int4)")
    parser.add_argument("--batch-sizes", type=comma_list(positive_int),
                        help="comma list (default: 1,2,4,8,16,32)")
    parser.add_argument("--threads", type=comma_list(positive_int),
                        help="intra-op thread counts to try (default: 1 and all usable cores)")
    parser.add_argument("--calib-count", type=positive_int)
    parser.add_argument("--prune", type=float, metavar="S",
                        help="also try the model pruned to sparsity S in (0, 1) (built-ins "
                             "only), under the same accuracy budget")
    parser.add_argument("--prune-epochs", type=positive_int, metavar="N",
                        help="distillation epochs after pruning (default: the pruner's)")
    parser.add_argument("--name", help="entry name in the repository (default: model name)")
    parser.add_argument("--write-on-slo-miss", action="store_true",
                        help="when no candidate meets the SLO, still write the lowest-latency "
                             "one (the exit code stays 3)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_data_arguments(parser)


def run(args: argparse.Namespace) -> int:
    # Here, not at the top: turboinfer.optimize loads onnx and onnxruntime (slow --help).
    from turboinfer.optimize import tune
    from turboinfer.optimize.search.tune_report import TABLE_COLUMNS

    with ProgressDisplay() as display:
        report = tune(args.model, args.output, slo_p99_ms=args.slo_p99_ms,
                      max_accuracy_drop=args.max_accuracy_drop, engines=args.engines,
                      devices=args.devices,
                      variants=args.variants,
                      calib_count=args.calib_count, batch_sizes=args.batch_sizes,
                      threads=args.threads, name=args.name,
                      prune=args.prune, prune_epochs=args.prune_epochs,
                      write_on_slo_miss=args.write_on_slo_miss,
                      progress=display.stage, **data_keywords(args))
    if args.json:
        print_json(report.to_dict())
        return _exit_code(report)
    metric = report.optimize.metric
    print(f"model: {report.model}  SLO p99 {args.slo_p99_ms:g} ms  "
          f"budget {report.optimize.budget}" + (f" of {metric.name}" if metric else "")
          + f"  ({report.elapsed_s:.0f} s)")
    print(format_table(TABLE_COLUMNS, report.table_rows()))
    for note in report.notes:
        print(f"note: {note}")
    if report.entry is not None:
        print(f"entry: {report.entry.parent / 'config.yaml'} and {report.entry}")
    print(f"report: {report.work / 'report.json'} and {report.work / 'report.html'}")
    return _exit_code(report)


def _exit_code(report: TuneReport) -> int:
    """0 with a configuration inside the SLO; 3 when none met it, so `tune && serve`
    never deploys a miss; 1 when nothing servable ran."""
    if report.best is None:
        return EXIT_NOTHING_RAN
    return 0 if report.best.eligible else EXIT_SLO_MISSED
