"""Argument parsers shared by subcommands: comma lists, numbers, durations, shapes,
engine settings."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import TypeVar

from turboinfer.engines import (
    CompileMode,
    EngineSettings,
    ExecutionMode,
    GraphOptimization,
    Precision,
    Toggle,
)
from turboinfer.errors import InvalidInputError
from turboinfer.shapes import SHAPE_HELP, SHAPE_SYNTAX, parse_shape_flag

T = TypeVar("T")


def comma_list(convert: Callable[[str], T]) -> Callable[[str], tuple[T, ...]]:
    def parse(text: str) -> tuple[T, ...]:
        try:
            return tuple(convert(part.strip()) for part in text.split(",") if part.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}") from None

    return parse


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text!r}")
    return value


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def duration_or_zero(text: str) -> float:
    """``500ms``, ``30s``, ``10m``, ``1h`` or plain seconds, in seconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration (e.g. 30s, 10m): {text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def duration(text: str) -> float:
    """As ``duration_or_zero``, above zero."""
    value = duration_or_zero(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than zero: {text!r}")
    return value


def input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=D1xD2`` with the meaning in :mod:`turboinfer.shapes` (batch axis excluded)."""
    try:
        return parse_shape_flag(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_shape_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                       batch_flag: str, note: str = "") -> None:
    """``--shape`` (alias ``--input-shape``): the same flag, the same meaning everywhere."""
    parser.add_argument("--shape", "--input-shape", dest="shape", type=input_shape,
                        action="append", default=[], metavar=SHAPE_SYNTAX,
                        help=SHAPE_HELP.format(batch_flag=batch_flag) + note)


def shape_flags(args: argparse.Namespace) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The ``--shape`` flags as given; an input named twice is an error, not a last-wins."""
    names = [name for name, _ in args.shape]
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:
        raise InvalidInputError(f"--shape names input {twice!r} twice")
    return tuple(args.shape)


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
    group.add_argument("--precision", choices=[p.value for p in Precision],
                       default=defaults.precision.value,
                       help="torch: the arithmetic (fp16 and tf32 on cuda only); "
                            "onnxruntime: fp16/bf16 on tensorrt")
    group.add_argument("--channels-last", choices=[t.value for t in Toggle],
                       default=defaults.channels_last.value,
                       help="torch: NHWC image inputs (auto: on for fp16/bf16 on a GPU)")
    group.add_argument("--compile", choices=[c.value for c in CompileMode], metavar="MODE",
                       default=defaults.compile.value,
                       help="torch: torch.compile at load in MODE: none, default (torch's "
                            "own default mode), reduce-overhead, max-autotune, "
                            "max-autotune-no-cudagraphs")
    group.add_argument("--cuda-graphs", action="store_true",
                       help="a CUDA graph per batch bucket up to the largest batch size "
                            "(torch), or ONNX Runtime's CUDA-graph option (fixed shapes)")


def engine_settings(args: argparse.Namespace, max_batch_size: int = 0) -> EngineSettings:
    """The settings the flags give; ``max_batch_size``: the largest batch the command
    will run, for the buckets CUDA graphs and compiled kernels are made for."""
    return EngineSettings(
        intra_op_threads=args.threads,
        execution_mode=ExecutionMode(args.execution_mode),
        graph_optimization=GraphOptimization(args.graph_optimization),
        memory_arena=not args.no_memory_arena,
        device=args.device,
        precision=Precision(args.precision),
        channels_last=Toggle(args.channels_last),
        compile=CompileMode(args.compile),
        cuda_graphs=args.cuda_graphs,
        max_batch_size=max_batch_size,
    )
