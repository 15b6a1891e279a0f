"""``turboinfer doctor``: why a deployment is slow, with the evidence, and what to change."""

from __future__ import annotations

import argparse
from pathlib import Path

from turboinfer.commands._args import comma_list, duration, positive_int
from turboinfer.doctor.api import DoctorRequest, run_doctor
from turboinfer.doctor.report import format_text
from turboinfer.doctor.selfrun import SelfRunSettings
from turboinfer.output import print_json

NAME = "doctor"
HELP = "say why inference is slow: findings with evidence and a fix"

REPORTS = ("load", "bench", "tune", "profile")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="?", metavar="URL|MODEL",
                        help="a running OIP server (http://HOST:PORT) to watch, or a model "
                             "(builtin:NAME, model.onnx) to bench here")
    parser.add_argument("--model", help="URL mode: the served model (the busiest one if not "
                                        "given)")
    parser.add_argument("--window", type=duration, default=30.0, metavar="DURATION",
                        help="URL mode: how long to watch the server, e.g. 30s")
    for kind in REPORTS:
        parser.add_argument(f"--{kind}", type=Path, metavar="REPORT.json",
                            help=f"a saved `turboinfer {kind}` report to judge")
    parser.add_argument("--server-log", type=Path, metavar="FILE",
                        help="the server's log, read for out-of-memory and allocation "
                             "failures")
    parser.add_argument("--threads", type=comma_list(positive_int),
                        default=SelfRunSettings.threads,
                        help="MODEL mode: the intra-op thread counts to compare")
    parser.add_argument("--batch-sizes", type=comma_list(positive_int),
                        default=SelfRunSettings.batch_sizes,
                        help="MODEL mode: the batch sizes to compare")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--html", type=Path, metavar="FILE.html", help="also write an "
                                                                       "HTML report")


def run(args: argparse.Namespace) -> int:
    target: str | None = args.target
    is_url = target is not None and target.startswith(("http://", "https://"))
    diagnosis = run_doctor(DoctorRequest(
        url=target if is_url else None, model=args.model, window_s=args.window,
        self_run=None if is_url else target,
        self_run_settings=SelfRunSettings(batch_sizes=args.batch_sizes, threads=args.threads),
        reports=tuple((k, getattr(args, k)) for k in REPORTS if getattr(args, k)),
        server_log=args.server_log))
    if args.html:
        # Here, not at the top: plotly (the page helpers) is needed only for --html.
        from turboinfer.doctor.html import write_html

        write_html(diagnosis, args.html)
    if args.json:
        print_json(diagnosis.to_dict())
    else:
        print(format_text(diagnosis))
    return 0
