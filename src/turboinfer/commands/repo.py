"""``turboinfer repo add``: create or extend a model-repository entry by hand."""

from __future__ import annotations

import argparse
from pathlib import Path

from turboinfer.commands._args import comma_list, positive_int
from turboinfer.errors import ConfigError
from turboinfer.models import resolve_model
from turboinfer.serve.config import (
    CONFIG_FILE,
    DynamicBatching,
    ModelConfig,
    load_config,
    write_entry,
)

NAME = "repo"
HELP = "manage a model repository: 'repo add REPO MODEL' adds a model version"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="repo_command", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="add MODEL (builtin:NAME or an .onnx file) as a version")
    add.add_argument("repository", type=Path, metavar="REPO", help="model repository folder")
    add.add_argument("model", help="builtin:NAME or a path to an .onnx file")
    add.add_argument("--name", help="model name in the repository (default: the model's)")
    add.add_argument("--version", type=positive_int, default=None,
                     help="version number (default: one more than the newest)")
    add.add_argument("--max-batch-size", type=int, default=None,
                     help="0 turns batching off; default: keep the entry's, else 0")
    add.add_argument("--max-queue-delay-ms", type=float, default=None,
                     help="dynamic batching: longest wait for a batch to fill")
    add.add_argument("--preferred-batch-sizes", type=comma_list(positive_int), default=None,
                     help="dynamic batching: batch sizes to form when possible, e.g. 4,8")
    add.add_argument("--max-queue-size", type=positive_int, default=None,
                     help="dynamic batching: queued requests before new ones are refused")
    add.add_argument("--instances", type=positive_int, default=None,
                     help="engine instances of the model serving in parallel")


def updated_config(current: ModelConfig, args: argparse.Namespace) -> ModelConfig:
    """The entry's config with the given options changed; the rest is kept."""
    changes: dict[str, object] = {}
    if args.max_batch_size is not None:
        if args.max_batch_size < 0:
            raise ConfigError("--max-batch-size must be >= 0")
        changes["max_batch_size"] = args.max_batch_size
    if args.instances is not None:
        changes["instances"] = args.instances
    batching: dict[str, object] = {}
    for option, key in (("max_queue_delay_ms", "max_queue_delay_ms"),
                        ("preferred_batch_sizes", "preferred_batch_sizes"),
                        ("max_queue_size", "max_queue_size")):
        if getattr(args, option) is not None:
            batching[key] = getattr(args, option)
    if batching:
        base = current.dynamic_batching or DynamicBatching()
        changes["dynamic_batching"] = base.model_copy(update=batching)
    merged = current.model_dump() | changes
    return ModelConfig.model_validate(merged)


def run(args: argparse.Namespace) -> int:
    model = resolve_model(args.model)
    name = args.name or model.name
    current = load_config(args.repository / name / CONFIG_FILE)
    config = updated_config(current, args)
    folder = write_entry(args.repository, name, model.artifact.onnx_path, config, args.version)
    print(f"added {name} version {folder.name} in {args.repository}")
    return 0
