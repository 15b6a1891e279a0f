"""``turboinfer export``: a PyTorch or Hugging Face model → a checked ONNX file."""

from __future__ import annotations

import argparse
from pathlib import Path

from turboinfer.errors import ConfigError
from turboinfer.output import format_table, print_json

NAME = "export"
HELP = "export a PyTorch or Hugging Face model to ONNX and check it against the source"

_SOURCE_HELP = (
    "package.module:factory (a function returning the torch.nn.Module; the working "
    "directory is importable), a TorchScript .pt or torch.export .pt2 file, or a Hugging "
    "Face model folder (config.json + weights)"
)
_INPUT_HELP = (
    "an example input NAME=D1xD2x...[:DTYPE], e.g. image=1x3x32x32:float32 or "
    "tokens=2x16:int64 (dtype default float32); once per input, in forward's order; the "
    "first axis is the dynamic batch axis. Default: example_inputs() beside the factory, "
    "or the inputs a .pt2 file carries"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help=_SOURCE_HELP)
    parser.add_argument("-o", "--output", type=Path, required=True, help="the .onnx file")
    parser.add_argument("--example-input", action="append", default=[], metavar="SPEC",
                        help=_INPUT_HELP)
    parser.add_argument("--task", choices=["feature-extraction", "sequence-classification"],
                        help="Hugging Face task (default: from the config's architectures)")
    parser.add_argument("--atol", type=float, default=1e-4,
                        help="max abs error allowed, times the output's scale (at least 1)")
    parser.add_argument("--opset", type=int, default=18, help="ONNX opset")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    # torch loads in seconds; keep it out of `turboinfer --help` and the other commands.
    from turboinfer.models.convert import ExportOptions, export_model
    from turboinfer.models.sources import parse_input_spec

    if args.output.suffix != ".onnx":
        raise ConfigError(f"output {args.output} must end in .onnx")
    options = ExportOptions(
        task=args.task,
        example_inputs=tuple(parse_input_spec(text) for text in args.example_input),
        atol=args.atol,
        opset=args.opset,
    )
    report = export_model(args.source, args.output, options)
    if args.json:
        print_json(report.to_dict())
        return 0
    print(f"wrote {report.path}" + (" (+ external data)" if report.external_data else ""))
    for kind, specs in (("inputs", report.inputs), ("outputs", report.outputs)):
        print(f"{kind}: " + ", ".join(f"{s.name} {list(s.shape)} {s.dtype.name}" for s in specs))
    rows = [[c.output, "x".join(map(str, c.shape)), f"{c.max_abs_error:.3g}",
             f"{c.cosine:.6f}", f"{c.bound:.3g}"] for c in report.checks]
    print(format_table(("output", "shape", "max_abs_error", "cosine", "tolerance"), rows))
    return 0
