"""``turboinfer serve``: the Open Inference Protocol server over a model repository."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from turboinfer.commands._args import comma_list, positive_int
from turboinfer.scaleout.requires import LOOPBACK_HOSTS, require_ray
from turboinfer.serve.core import ModelControl, ServerSettings
from turboinfer.serve.server import Bound
from turboinfer.serve.server import run as run_server

MIB = 1024 * 1024
NAME = "serve"
HELP = "serve a model repository (or the built-in zoo) over HTTP and gRPC (KServe v2 / Triton)"


# Defaults come from the settings object, so the help and the server agree.
_DEFAULTS = ServerSettings()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repository", nargs="?", type=Path, default=None, metavar="REPO",
                        help="model repository folder (default: the built-in zoo)")
    parser.add_argument("--host", default=_DEFAULTS.host,
                        help="address to bind (127.0.0.1: this machine only)")
    parser.add_argument("--http-port", type=int, default=_DEFAULTS.http_port,
                        help="0: any free port")
    parser.add_argument("--grpc-port", type=int, default=_grpc_port(_DEFAULTS.grpc_port),
                        help="-1: no gRPC; 0: any")
    parser.add_argument("--model-control", choices=[m.value for m in ModelControl],
                        default=_DEFAULTS.model_control.value,
                        help="poll: pick up repository changes every --poll-seconds; explicit: "
                             "only through the load/unload API; none: fixed at start")
    parser.add_argument("--poll-seconds", type=float, default=_DEFAULTS.poll_seconds,
                        help="how often poll mode looks for repository changes")
    parser.add_argument("--zoo-models", type=comma_list(str), default=_DEFAULTS.zoo_models,
                        help="without REPO: built-in models built (first run: exported "
                             "and cached) and loaded at start; the other built-in models "
                             "are listed and load through the repository API")
    parser.add_argument("--max-body-mb", type=positive_int,
                        default=_DEFAULTS.max_body_bytes // MIB,
                        help="largest accepted request body in MiB")
    parser.add_argument("--max-json-body-mb", type=positive_int,
                        default=_DEFAULTS.max_json_body_bytes // MIB,
                        help="largest accepted all-JSON request body in MiB (parsing JSON "
                             "tensors takes more memory than binary ones)")
    parser.add_argument("--max-body-mb-in-flight", type=positive_int,
                        default=_DEFAULTS.max_body_bytes_in_flight // MIB,
                        help="request body MiB held at once, all connections together; "
                             "beyond it a request gets 503 with Retry-After")
    parser.add_argument("--max-connections", type=positive_int,
                        default=_DEFAULTS.max_connections,
                        help="open HTTP connections; beyond it new ones get 503")
    parser.add_argument("--drain-seconds", type=float, default=_DEFAULTS.drain_timeout_s,
                        help="on SIGTERM, how long in-flight requests may take to finish")
    ray = parser.add_argument_group("Ray Serve (the ray extra)")
    ray.add_argument("--ray", action="store_true",
                     help="run each model of REPO as a Ray Serve deployment (its replicas "
                          "and autoscaling from config.yaml) behind an ingress with the "
                          "same HTTP URLs; no gRPC")
    ray.add_argument("--ray-address", default="local", metavar="local|auto|ray://HOST:PORT",
                     help="local: start a Ray instance that stops with this command; auto "
                          "or ray://...: deploy on a running cluster")
    ray.add_argument("--ray-cpus", type=positive_int, default=None,
                     help="with a local instance: the CPUs Ray may hand to replicas (default: "
                          "the usable cores; more oversubscribes them)")
    ray.add_argument("--replicas", type=positive_int, default=None,
                     help="with --ray: a fixed replica count per model (default: the "
                          "entry's autoscaling section, else 1)")


def _grpc_port(port: int | None) -> int:
    """The settings' ``None`` (no gRPC) as the command line writes it."""
    return -1 if port is None else port


def settings_from(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        repository=args.repository,
        zoo_models=tuple(args.zoo_models),
        host=args.host,
        http_port=args.http_port,
        grpc_port=None if args.grpc_port < 0 else args.grpc_port,
        model_control=ModelControl(args.model_control),
        poll_seconds=args.poll_seconds,
        max_body_bytes=args.max_body_mb * MIB,
        max_json_body_bytes=args.max_json_body_mb * MIB,
        max_body_bytes_in_flight=args.max_body_mb_in_flight * MIB,
        max_connections=args.max_connections,
        drain_timeout_s=args.drain_seconds,
    )


def run(args: argparse.Namespace) -> int:
    if args.ray:
        return _run_on_ray(args)

    def announce(bound: Bound) -> None:
        grpc = f" grpc={bound.host}:{bound.grpc_port}" if bound.grpc_port is not None else ""
        # One parseable line on stdout: scripts and tests wait for it.
        print(f"turboinfer serving http={bound.host}:{bound.http_port}{grpc}", flush=True)

    run_server(settings_from(args), on_ready=announce)
    print("turboinfer stopped", file=sys.stderr)
    return 0


def _run_on_ray(args: argparse.Namespace) -> int:
    require_ray(loopback=args.ray_address == "local" and args.host in LOOPBACK_HOSTS)
    # Here, not at the top: Ray takes seconds to import, and only --ray needs it.
    from turboinfer.scaleout.cluster import RaySettings
    from turboinfer.scaleout.ray_app import Deployed, serve_repository

    def announce(deployed: Deployed) -> None:
        # The same ready line as without --ray (no gRPC), then one line per model.
        print(f"turboinfer serving http={deployed.host}:{deployed.port}", flush=True)
        print(f"  ray cluster: {deployed.ray_address}", file=sys.stderr)
        for name, plan in deployed.plans.items():
            scaling = (f"autoscaling {plan.min_replicas}..{plan.max_replicas} replicas, "
                       f"target {plan.target_ongoing_requests:g} ongoing requests"
                       if plan.autoscaling else f"{plan.min_replicas} replica(s)")
            print(f"  {name}: {scaling}, {plan.cpus_per_replica} CPU each", file=sys.stderr)

    serve_repository(settings_from(args), RaySettings(address=args.ray_address,
                                                         num_cpus=args.ray_cpus),
                     replicas=args.replicas, on_ready=announce)
    print("turboinfer stopped", file=sys.stderr)
    return 0
