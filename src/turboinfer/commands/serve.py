"""``turboinfer serve``: the Open Inference Protocol server over a model repository."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from turboinfer.commands._args import comma_list, positive_int
from turboinfer.serve.core import DEFAULT_ZOO_MODELS, ModelControl, ServerSettings

NAME = "serve"
HELP = "serve a model repository (or the built-in zoo) over HTTP and gRPC (KServe v2 / Triton)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repository", nargs="?", type=Path, default=None, metavar="REPO",
                        help="model repository folder (default: the built-in zoo)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--http-port", type=int, default=8000, help="0: any free port")
    parser.add_argument("--grpc-port", type=int, default=8001, help="-1: no gRPC; 0: any")
    parser.add_argument("--model-control", choices=[m.value for m in ModelControl],
                        default=ModelControl.EXPLICIT.value,
                        help="poll: pick up repository changes every --poll-seconds; explicit: "
                             "only through the load/unload API; none: fixed at start")
    parser.add_argument("--poll-seconds", type=float, default=5.0)
    parser.add_argument("--zoo-models", type=comma_list(str), default=DEFAULT_ZOO_MODELS,
                        help="without REPO: built-in models built (first run: exported "
                             "and cached) and loaded at start; the other built-in models "
                             "are listed and load through the repository API "
                             f"(default {','.join(DEFAULT_ZOO_MODELS)})")
    parser.add_argument("--max-body-mb", type=positive_int, default=64,
                        help="largest accepted request body in MiB (default 64)")
    parser.add_argument("--drain-seconds", type=float, default=30.0,
                        help="on SIGTERM, how long in-flight requests may take to finish")


def settings_from(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        repository=args.repository,
        zoo_models=tuple(args.zoo_models),
        host=args.host,
        http_port=args.http_port,
        grpc_port=None if args.grpc_port < 0 else args.grpc_port,
        model_control=ModelControl(args.model_control),
        poll_seconds=args.poll_seconds,
        max_body_bytes=args.max_body_mb * 1024 * 1024,
        drain_timeout_s=args.drain_seconds,
    )


def run(args: argparse.Namespace) -> int:
    from turboinfer.serve.server import Bound
    from turboinfer.serve.server import run as run_server

    def announce(bound: Bound) -> None:
        grpc = f" grpc={bound.host}:{bound.grpc_port}" if bound.grpc_port is not None else ""
        # One parseable line on stdout: scripts and tests wait for it.
        print(f"turboinfer serving http={bound.host}:{bound.http_port}{grpc}", flush=True)

    run_server(settings_from(args), on_ready=announce)
    print("turboinfer stopped", file=sys.stderr)
    return 0
