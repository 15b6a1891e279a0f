"""``turboinfer load``: load-test an Open Inference Protocol server, or compare two runs.

    turboinfer load URL --model NAME [--scenario single|concurrency|poisson|maxrate|soak]
    turboinfer load compare A.json B.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from turboinfer.commands._args import (
    add_shape_argument,
    comma_list,
    duration,
    duration_or_zero,
    positive_float,
    positive_int,
    shape_flags,
)
from turboinfer.errors import ConfigError
from turboinfer.load.compare import compare_files, format_comparison
from turboinfer.load.loadgen import LoadgenSettings, format_loadgen, run_loadgen
from turboinfer.load.report import format_report, to_json, write_json
from turboinfer.load.scenarios import Scenario, ScenarioSettings
from turboinfer.load.session import LoadSettings, error_verdict, run_load
from turboinfer.output import print_json
from turboinfer.progress import ProgressDisplay

NAME = "load"
HELP = "load-test an inference server (OIP v2: turboinfer, Triton, KServe, MLServer)"

COMPARE = "compare"
SCENARIO_DEFAULTS = {"soak": {"duration": 600.0, "window": 10.0}}
# Defaults come from the settings objects, so the help and the library agree.
_SCENARIO = ScenarioSettings()
_LOAD = LoadSettings(url="", model="")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="URL",
                        help="server URL (http://127.0.0.1:8000, or HOST:PORT for gRPC); "
                             "or 'compare' followed by two JSON reports")
    parser.add_argument("reports", nargs="*", metavar="REPORT.json",
                        help="with 'compare': the baseline and the candidate report")
    _add_request_arguments(parser)
    _add_scenario_arguments(parser)
    _add_output_arguments(parser)


def _add_request_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("what to send")
    group.add_argument("--model", help="model name on the server (required for a load test)")
    group.add_argument("--model-version", default=_LOAD.version,
                       help="version (empty: the server's choice)")
    group.add_argument("--protocol", choices=["http", "grpc"], default=_LOAD.protocol,
                       help="the server's protocol")
    encoding = group.add_mutually_exclusive_group()
    encoding.add_argument("--binary", dest="binary", action="store_true", default=True,
                          help="HTTP tensors in the binary data extension (the default)")
    encoding.add_argument("--json-tensors", dest="binary", action="store_false",
                          help="HTTP tensors as JSON lists")
    group.add_argument("--input-data", type=Path, metavar="PATH",
                       help="an .npz of tensors keyed by input name; or, for a model the "
                            "server pre-processes, a folder of images (JPEG/PNG/WebP) or a "
                            "text file (one string per line), sent as its raw BYTES input "
                            "(or as the one input of a model whose only input is BYTES) "
                            "(default: random tensors, from metadata)")
    add_shape_argument(group, "--batch-size",
                       ". Changed: this flag used to take the whole shape, batch axis included")
    group.add_argument("--batch-size", type=positive_int, default=_LOAD.batch_size,
                       help="rows per request when the first axis is dynamic")
    group.add_argument("--timeout", type=duration, default=_SCENARIO.timeout_s,
                       help="per request, in seconds or with a unit (500ms, 1m)")
    group.add_argument("--max-connections", type=positive_int, default=_LOAD.max_connections,
                       help="open-loop connection cap")
    group.add_argument("--metrics-url", default=None,
                       help="Prometheus endpoint (default: URL/metrics for HTTP)")
    group.add_argument("--no-metrics", action="store_true", help="do not scrape /metrics")


def _add_scenario_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scenario")
    group.add_argument("--scenario", default=_SCENARIO.scenario.value,
                       choices=[s.value for s in Scenario], help="what load to apply")
    group.add_argument("--concurrency", type=comma_list(positive_int),
                       default=_SCENARIO.concurrency,
                       help="closed-loop levels")
    group.add_argument("--rate", type=positive_float, default=_SCENARIO.rate,
                       help="Poisson arrivals per second (poisson, soak)")
    group.add_argument("--p99-ms", type=positive_float, default=_SCENARIO.p99_ms,
                       help="latency bound for maxrate")
    group.add_argument("--duration", type=duration, default=None,
                       help="single/poisson/soak run length (default: 10s; soak 10m)")
    group.add_argument("--window", type=duration, default=None,
                       help="measurement window (default: 1s; soak 10s)")
    group.add_argument("--max-windows", type=positive_int, default=_SCENARIO.max_windows,
                       help="windows per concurrency level before giving up on stability")
    group.add_argument("--stability", type=positive_float, default=_SCENARIO.stability,
                       help="last 3 windows agree within this fraction")
    group.add_argument("--trial-duration", type=duration, default=_SCENARIO.trial_s,
                       help="maxrate: length of each trial, in seconds")
    group.add_argument("--max-trials", type=positive_int, default=_SCENARIO.max_trials,
                       help="maxrate: trials of the rate search at most")
    group.add_argument("--probe-concurrency", type=positive_int,
                       default=_SCENARIO.probe_concurrency,
                       help="maxrate: closed-loop level that estimates capacity")
    group.add_argument("--max-error-rate", type=positive_float,
                       default=_SCENARIO.max_error_rate,
                       help="failures allowed before a run counts as failed")
    group.add_argument("--warmup", type=duration_or_zero, default=_SCENARIO.warmup_s,
                       help="unmeasured load before each run, in seconds")
    group.add_argument("--max-requests", type=int, default=_SCENARIO.max_requests,
                       help="stop a run after this many requests (0: no limit)")
    group.add_argument("--seed", type=int, default=_SCENARIO.seed,
                       help="seed of the random inputs and arrival times")
    group.add_argument("--min-duration", type=duration_or_zero, default=_LOAD.min_duration_s,
                       help="validity: shortest acceptable run, in seconds")
    group.add_argument("--min-requests", type=int, default=_LOAD.min_requests,
                       help="validity: fewest acceptable successes per run")
    group.add_argument("--loadgen", choices=["singlestream", "server", "offline"],
                       help="run MLPerf LoadGen (mlcommons-loadgen) instead of a scenario; "
                            "--duration, --rate and --p99-ms carry over")
    group.add_argument("--loadgen-logs", type=Path, default=Path("mlperf-logs"),
                       help="folder for LoadGen's logs")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("--json", action="store_true", help="the JSON report on stdout")
    group.add_argument("--output", type=Path, metavar="FILE.json",
                       help="also write the JSON report here (for 'load compare')")
    group.add_argument("--html", type=Path, metavar="FILE.html",
                       help="a self-contained HTML report with charts")
    group.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    if args.target == COMPARE:
        return _run_compare(args)
    if args.reports:
        raise ConfigError(f"unexpected arguments after the URL: {' '.join(args.reports)}")
    if not args.model:
        raise ConfigError("--model is required: the model name on the server")
    if args.loadgen:
        return _run_loadgen(args)
    return _run_load(args)


def _run_load(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    with ProgressDisplay(enabled=not args.quiet) as display:
        report = run_load(settings, progress=display.update)
    if args.output:
        write_json(report, args.output)
    if args.html:
        # Here, not at the top: the HTML report's charting code is needed only for --html.
        from turboinfer.load.html import write_html

        write_html(report, args.html)
    if args.json:
        sys.stdout.write(to_json(report).decode() + "\n")
    else:
        print(format_report(report))
    failure = error_verdict(report, settings.scenario.max_error_rate)
    if failure:
        print(f"error: {failure}", file=sys.stderr)
        return 1
    return 0


def load_settings(args: argparse.Namespace) -> LoadSettings:
    if args.shape and args.input_data:
        raise ConfigError("--shape shapes the random inputs; --input-data gives whole tensors "
                          "(batch axis included): use one of them")
    defaults = SCENARIO_DEFAULTS.get(args.scenario, {})
    scenario = ScenarioSettings(
        scenario=Scenario(args.scenario),
        duration_s=args.duration or defaults.get("duration", _SCENARIO.duration_s),
        concurrency=args.concurrency, rate=args.rate, p99_ms=args.p99_ms,
        window_s=args.window or defaults.get("window", _SCENARIO.window_s),
        max_windows=args.max_windows, stability=args.stability,
        trial_s=args.trial_duration, max_trials=args.max_trials,
        probe_concurrency=args.probe_concurrency, max_error_rate=args.max_error_rate,
        warmup_s=args.warmup, max_requests=args.max_requests,
        timeout_s=args.timeout, seed=args.seed,
    )
    return LoadSettings(
        url=args.target, model=args.model, version=args.model_version,
        protocol=args.protocol, binary=args.binary, input_file=args.input_data,
        shapes=shape_flags(args), batch_size=args.batch_size,
        max_connections=args.max_connections,
        metrics_url="" if args.no_metrics else args.metrics_url,
        min_duration_s=args.min_duration, min_requests=args.min_requests,
        scenario=scenario,
    )


def _run_compare(args: argparse.Namespace) -> int:
    if len(args.reports) != 2:
        raise ConfigError("usage: turboinfer load compare BASELINE.json CANDIDATE.json")
    comparison = compare_files(Path(args.reports[0]), Path(args.reports[1]))
    if args.json:
        print_json(comparison)
    else:
        print(format_comparison(comparison))
    return 0


def _run_loadgen(args: argparse.Namespace) -> int:
    summary = run_loadgen(load_settings(args), LoadgenSettings(
        mode=args.loadgen, output_dir=args.loadgen_logs, min_query_count=args.min_requests))
    print(format_loadgen(summary))
    return 0 if summary.valid else 1
