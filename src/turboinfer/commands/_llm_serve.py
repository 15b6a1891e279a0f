"""``turboinfer llm serve``: the OpenAI-compatible server over the LLM engine."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from turboinfer.commands._args import positive_int

if TYPE_CHECKING:
    from turboinfer.llm import LLM

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


def run(args: argparse.Namespace, build: Callable[..., LLM]) -> int:
    """``build(args, **engine_overrides)`` loads the model as ``llm generate`` does."""
    # Here, not at the top: turboinfer.llm loads torch, too slow for every --help.
    from turboinfer.llm import demo_model_dir
    from turboinfer.llm.server import Bound, ServerSettings
    from turboinfer.llm.server import run as run_server

    model_dir = Path(args.model) if args.model else demo_model_dir()
    name = args.served_model_name or ("demo" if args.model is None else model_dir.name)
    settings = ServerSettings(host=args.host, port=args.port, model_name=name,
                              api_key=args.api_key, max_waiting=args.max_waiting,
                              request_timeout_s=args.request_timeout)
    overrides: dict[str, Any] = {"max_num_seqs": args.max_num_seqs}
    if args.no_prefix_caching:
        overrides["enable_prefix_caching"] = False
    llm = build(args, **overrides)

    def announce(bound: Bound) -> None:
        # One parseable line on stdout: scripts and tests wait for it.
        print(f"turboinfer llm serving http={bound.host}:{bound.port} "
              f"model={bound.model_name}", flush=True)

    run_server(llm, settings, model_dir, on_ready=announce)
    print("turboinfer llm server stopped", file=sys.stderr)
    return 0
