"""Argument parsers shared by subcommands: comma lists, shapes, engine settings."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from turboinfer.engines import EngineSettings, ExecutionMode, GraphOptimization

T = TypeVar("T")


def comma_list(convert: Callable[[str], T]) -> Callable[[str], tuple[T, ...]]:
    def parse(text: str) -> tuple[T, ...]:
        try:
            return tuple(convert(part.strip()) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}") from None

    return parse


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=D1xD2`` (without the batch axis when it is dynamic)."""
    name, sep, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        shape = ()
    if not sep or not name or not shape:
        raise argparse.ArgumentTypeError(f"expected NAME=D1xD2..., got {text!r}")
    return name, shape


def add_engine_settings(parser: argparse.ArgumentParser) -> None:
    defaults = EngineSettings()
    group = parser.add_argument_group("engine settings")
    group.add_argument("--threads", type=int, default=defaults.intra_op_threads,
                       help="intra-op threads (0: the engine's choice)")
    group.add_argument("--execution-mode", choices=[m.value for m in ExecutionMode],
                       default=defaults.execution_mode.value,
                       help="operators one after another, or independent ones in parallel")
    group.add_argument("--graph-optimization", choices=[g.value for g in GraphOptimization],
                       default=defaults.graph_optimization.value,
                       help="how much the engine rewrites the graph before running it")
    group.add_argument("--no-memory-arena", action="store_true",
                       help="disable the engine's memory arena")
    group.add_argument("--device", choices=["cpu", "cuda", "tensorrt"], default=defaults.device,
                       help="where the engine runs")


def engine_settings(args: argparse.Namespace) -> EngineSettings:
    return EngineSettings(
        intra_op_threads=args.threads,
        execution_mode=ExecutionMode(args.execution_mode),
        graph_optimization=GraphOptimization(args.graph_optimization),
        memory_arena=not args.no_memory_arena,
        device=args.device,
    )
