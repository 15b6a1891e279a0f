"""``turboinfer load``: load-test an Open Inference Protocol server, or compare two runs.

    turboinfer load URL --model NAME [--scenario single|concurrency|poisson|maxrate|soak]
    turboinfer load compare A.json B.json
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from turboinfer.commands._args import comma_list, input_shape, positive_int
from turboinfer.errors import ConfigError

if TYPE_CHECKING:
    from turboinfer.load.session import LoadSettings

NAME = "load"
HELP = "load-test an inference server (OIP v2: turboinfer, Triton, KServe, MLServer)"

COMPARE = "compare"
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
SCENARIO_DEFAULTS = {"soak": {"duration": 600.0, "window": 10.0}}


def duration_or_zero(text: str) -> float:
    """``500ms``, ``30s``, ``10m``, ``1h`` or plain seconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration (e.g. 30s, 10m): {text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def duration(text: str) -> float:
    value = duration_or_zero(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than zero: {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


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
    group.add_argument("--model-version", default="", help="version (default: server's)")
    group.add_argument("--protocol", choices=["http", "grpc"], default="http")
    encoding = group.add_mutually_exclusive_group()
    encoding.add_argument("--binary", dest="binary", action="store_true", default=True,
                          help="HTTP tensors in the binary data extension (default)")
    encoding.add_argument("--json-tensors", dest="binary", action="store_false",
                          help="HTTP tensors as JSON lists")
    group.add_argument("--input-data", type=Path, metavar="FILE.npz",
                       help="tensors keyed by input name (default: random, from metadata)")
    group.add_argument("--shape", type=input_shape, action="append", default=[],
                       metavar="NAME=D1xD2", help="full shape of an input with dynamic axes")
    group.add_argument("--batch-size", type=positive_int, default=1,
                       help="rows per request when the first axis is dynamic (default 1)")
    group.add_argument("--timeout", type=duration, default=30.0, help="per request (30s)")
    group.add_argument("--max-connections", type=positive_int, default=1024,
                       help="open-loop connection cap (default 1024)")
    group.add_argument("--metrics-url", default=None,
                       help="Prometheus endpoint (default URL/metrics for HTTP)")
    group.add_argument("--no-metrics", action="store_true", help="do not scrape /metrics")


def _add_scenario_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scenario")
    group.add_argument("--scenario", default="single",
                       choices=["single", "concurrency", "poisson", "maxrate", "soak"])
    group.add_argument("--concurrency", type=comma_list(positive_int), default=(1, 4, 16, 64),
                       help="closed-loop levels (default 1,4,16,64)")
    group.add_argument("--rate", type=positive_float, default=0.0,
                       help="Poisson arrivals per second (poisson, soak)")
    group.add_argument("--p99-ms", type=positive_float, default=0.0,
                       help="latency bound for maxrate")
    group.add_argument("--duration", type=duration, default=None,
                       help="single/poisson/soak run length (10s; soak 10m)")
    group.add_argument("--window", type=duration, default=None,
                       help="measurement window (1s; soak 10s)")
    group.add_argument("--max-windows", type=positive_int, default=10,
                       help="windows per concurrency level before giving up on stability")
    group.add_argument("--stability", type=positive_float, default=0.10,
                       help="last 3 windows agree within this fraction (0.10)")
    group.add_argument("--trial-duration", type=duration, default=5.0,
                       help="maxrate: length of each trial (5s)")
    group.add_argument("--max-trials", type=positive_int, default=10)
    group.add_argument("--probe-concurrency", type=positive_int, default=16,
                       help="maxrate: closed-loop level that estimates capacity (16)")
    group.add_argument("--max-error-rate", type=positive_float, default=0.01,
                       help="failures allowed before a run counts as failed (0.01)")
    group.add_argument("--warmup", type=duration_or_zero, default=1.0,
                       help="unmeasured load before each run (1s)")
    group.add_argument("--max-requests", type=int, default=0,
                       help="stop a run after this many requests (0: no limit)")
    group.add_argument("--seed", type=int, default=0)
    group.add_argument("--min-duration", type=duration_or_zero, default=1.0,
                       help="validity: shortest acceptable run (1s)")
    group.add_argument("--min-requests", type=int, default=100,
                       help="validity: fewest acceptable successes per run (100)")
    group.add_argument("--loadgen", choices=["singlestream", "server", "offline"],
                       help="run MLPerf LoadGen (mlcommons-loadgen) instead of a scenario; "
                            "--duration, --rate and --p99-ms carry over")
    group.add_argument("--loadgen-logs", type=Path, default=Path("mlperf-logs"),
                       help="folder for LoadGen's logs (default ./mlperf-logs)")


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("output")
    group.add_argument("--json", action="store_true", help="the JSON report on stdout")
    group.add_argument("--output", type=Path, metavar="FILE.json",
                       help="also write the JSON report here (for 'load compare')")
    group.add_argument("--html", type=Path, metavar="FILE.html",
                       help="a self-contained HTML report with charts")
    group.add_argument("--quiet", action="store_true", help="no live progress line")


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
    from turboinfer.load.html import write_html
    from turboinfer.load.report import format_report, to_json, write_json
    from turboinfer.load.session import error_verdict, run_load

    settings = load_settings(args)
    progress = ProgressLine(enabled=not (args.json or args.quiet))
    report = run_load(settings, progress=progress)
    progress.clear()
    if args.output:
        write_json(report, args.output)
    if args.html:
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
    from turboinfer.load.scenarios import Scenario, ScenarioSettings
    from turboinfer.load.session import LoadSettings

    defaults = SCENARIO_DEFAULTS.get(args.scenario, {})
    scenario = ScenarioSettings(
        scenario=Scenario(args.scenario),
        duration_s=args.duration or defaults.get("duration", 10.0),
        concurrency=args.concurrency, rate=args.rate, p99_ms=args.p99_ms,
        window_s=args.window or defaults.get("window", 1.0),
        max_windows=args.max_windows, stability=args.stability,
        trial_s=args.trial_duration, max_trials=args.max_trials,
        probe_concurrency=args.probe_concurrency, max_error_rate=args.max_error_rate,
        warmup_s=args.warmup, max_requests=args.max_requests,
        timeout_s=args.timeout, seed=args.seed,
    )
    return LoadSettings(
        url=args.target, model=args.model, version=args.model_version,
        protocol=args.protocol, binary=args.binary, input_file=args.input_data,
        shapes=tuple(args.shape), batch_size=args.batch_size,
        max_connections=args.max_connections,
        metrics_url="" if args.no_metrics else args.metrics_url,
        min_duration_s=args.min_duration, min_requests=args.min_requests,
        scenario=scenario,
    )


class ProgressLine:
    """A live line on stderr when it is a terminal; nothing otherwise."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()

    def __call__(self, line: str) -> None:
        if self.enabled:
            print(f"\r\033[K{line}", end="", file=sys.stderr, flush=True)

    def clear(self) -> None:
        if self.enabled:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


def _run_compare(args: argparse.Namespace) -> int:
    from turboinfer.load.compare import compare_files, format_comparison

    if len(args.reports) != 2:
        raise ConfigError("usage: turboinfer load compare BASELINE.json CANDIDATE.json")
    comparison = compare_files(Path(args.reports[0]), Path(args.reports[1]))
    if args.json:
        from turboinfer.output import print_json

        print_json(comparison)
    else:
        print(format_comparison(comparison))
    return 0


def _run_loadgen(args: argparse.Namespace) -> int:
    from turboinfer.load.loadgen import LoadgenSettings, format_loadgen, run_loadgen

    summary = run_loadgen(load_settings(args), LoadgenSettings(
        mode=args.loadgen, output_dir=args.loadgen_logs, min_query_count=args.min_requests))
    print(format_loadgen(summary))
    return 0 if summary.valid else 1
