"""``turboinfer llm serve``: the OpenAI-compatible server over the LLM engine."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turboinfer.commands._args import positive_int
from turboinfer.errors import ConfigError
from turboinfer.scaleout.requires import LOOPBACK_HOSTS, require_ray

if TYPE_CHECKING:
    from turboinfer.llm import LLM
    from turboinfer.llm.server import ServerSettings

HELP = "serve the model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/...)"


def add_serve_parser(sub: Any, add_model_options: Callable[[argparse.ArgumentParser], None],
                     build: Callable[..., LLM]) -> None:
    """``llm serve``: the model options ``llm bench`` takes, then the server's own."""
    parser = sub.add_parser("serve", help=HELP)
    add_model_options(parser)
    add_arguments(parser)
    parser.set_defaults(_llm_run=lambda args: run(args, build))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port")
    parser.add_argument("--served-model-name", default=None,
                        help="the model name clients send (default: 'demo' for the shipped "
                             "model, else the folder's name)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on /v1 and /v2 routes")
    parser.add_argument("--max-num-seqs", type=positive_int, default=64,
                        help="sequences decoded together in one batch")
    parser.add_argument("--max-waiting", type=int, default=256,
                        help="requests that may wait for a batch slot; more get 429 with "
                             "Retry-After")
    parser.add_argument("--request-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="abort a request (504) that runs longer")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="recompute every prompt instead of reusing the KV blocks of "
                             "prompts that share a prefix")
    ray = parser.add_argument_group("Ray Serve (the ray extra)")
    ray.add_argument("--ray", action="store_true",
                     help="run the server as Ray Serve replicas, each with its own engine, "
                          "behind one OpenAI-compatible HTTP door")
    ray.add_argument("--ray-address", default="local", metavar="local|auto|ray://HOST:PORT",
                     help="local: start a Ray instance that stops with this command; auto "
                          "or ray://...: deploy on a running cluster")
    ray.add_argument("--ray-cpus", type=positive_int, default=None,
                     help="with a local instance: the CPUs Ray may hand to replicas (default: "
                          "the usable cores)")
    ray.add_argument("--replicas", type=positive_int, default=1,
                     help="with --ray: replicas at start and at least")
    ray.add_argument("--max-replicas", type=positive_int, default=None,
                     help="with --ray: above --replicas, Ray adds replicas while requests "
                          "wait for a batch slot (default: --replicas, no autoscaling)")


def run(args: argparse.Namespace, build: Callable[..., LLM]) -> int:
    """``build(args, **engine_overrides)`` loads the model as ``llm generate`` does."""
    # Here, not at the top: turboinfer.llm loads torch, too slow for every --help.
    from turboinfer.llm.api import model_folder
    from turboinfer.llm.server import Bound, ServerSettings
    from turboinfer.llm.server import run as run_server

    model_dir = model_folder(args.model)  # a .gguf file: its converted folder
    given = Path(args.model or "demo")
    name = args.served_model_name or (given.stem if given.suffix == ".gguf" else given.name)
    settings = ServerSettings(host=args.host, port=args.port, model_name=name,
                              api_key=args.api_key, max_waiting=args.max_waiting,
                              request_timeout_s=args.request_timeout)
    overrides: dict[str, Any] = {"max_num_seqs": args.max_num_seqs}
    if args.no_prefix_caching:
        overrides["enable_prefix_caching"] = False
    if args.ray:
        return _run_on_ray(args, build, overrides, settings, model_dir)
    llm = build(args, **overrides)

    def announce(bound: Bound) -> None:
        # One parseable line on stdout: scripts and tests wait for it.
        print(f"turboinfer llm serving http={bound.host}:{bound.port} "
              f"model={bound.model_name}", flush=True)

    run_server(llm, settings, model_dir, on_ready=announce)
    print("turboinfer llm server stopped", file=sys.stderr)
    return 0


def _run_on_ray(args: argparse.Namespace, build: Callable[..., LLM],
                overrides: dict[str, Any], settings: ServerSettings, model_dir: Path) -> int:
    require_ray(loopback=args.ray_address == "local" and args.host in LOOPBACK_HOSTS)
    # Here, not at the top: Ray takes seconds to import, and only --ray needs it.
    from turboinfer.scaleout.cluster import RaySettings
    from turboinfer.scaleout.ray_llm import DeployedLLM, LLMReplicas, serve_llm

    high = args.max_replicas or args.replicas
    if high < args.replicas:
        raise ConfigError(f"--max-replicas {high} is below --replicas {args.replicas}")
    # Each replica builds its own engine from the same options (plain values only: the
    # parser's callbacks stay here).
    options = argparse.Namespace(**{k: v for k, v in vars(args).items() if not callable(v)})
    replicas = LLMReplicas(replicas=args.replicas, max_replicas=high,
                           cpus_per_replica=max(1, args.threads))

    def announce(deployed: DeployedLLM) -> None:
        print(f"turboinfer llm serving http={deployed.host}:{deployed.port} "
              f"model={deployed.model_name}", flush=True)
        print(f"  ray cluster: {deployed.ray_address}; {replicas.replicas}.."
              f"{replicas.max_replicas} replicas", file=sys.stderr)

    serve_llm(functools.partial(build, options, **overrides), settings, model_dir,
              args.max_num_seqs, replicas, RaySettings(address=args.ray_address,
                                                       num_cpus=args.ray_cpus),
              on_ready=announce)
    print("turboinfer llm server stopped", file=sys.stderr)
    return 0
