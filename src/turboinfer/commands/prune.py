"""``turboinfer prune``: structured pruning + distillation of a PyTorch model.

The model is a built-in or the user's own source: ``package.module:factory`` with its
training arrays, or a Hugging Face encoder folder (text, tokenized by its tokenizer).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from turboinfer.commands._args import comma_list, positive_float, positive_int
from turboinfer.errors import ConfigError
from turboinfer.output import print_json
from turboinfer.progress import ProgressDisplay

if TYPE_CHECKING:
    from turboinfer.prune.settings import PruneSettings

NAME = "prune"
HELP = "prune channels/heads (L1 then Taylor), distil from the original, export ONNX"


def _fraction(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


# PruneSettings', DistillSettings' and LatencySettings' defaults, repeated (tests check
# they agree): importing turboinfer.prune loads torch, too slow for `turboinfer --help`.
DEFAULTS = {"target_sparsity": 0.5, "steps_per_phase": 2, "temperature": 4.0, "seed": 0,
            "latency_batch": 1, "latency_seconds": 2.0}
LATENCY_ROUNDS = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="builtin:NAME, package.module:factory or a Hugging Face "
                                       "encoder folder (pruning needs the PyTorch model)")
    parser.add_argument("--target-sparsity", type=_fraction, default=DEFAULTS["target_sparsity"],
                        help="fraction of each prunable layer's channels/heads to remove, in "
                             "(0, 1)")
    parser.add_argument("--schedule", default=None, metavar="CRIT:AMOUNT,...",
                        help="e.g. l1:0.3,taylor:0.2; amounts add up to the target "
                             "(default: L1 for 60%% of it, then Taylor)")
    parser.add_argument("--steps-per-phase", type=positive_int,
                        default=int(DEFAULTS["steps_per_phase"]),
                        help="pruning steps per schedule phase, each followed by fine-tuning")
    parser.add_argument("--distill-epochs", type=int, default=None,
                        help="passes over the training data (default: 10; builtin:minilm and text "
                             "folders 2: their epoch is ~51,000 texts plus --train-data)")
    parser.add_argument("--temperature", type=float, default=DEFAULTS["temperature"],
                        help="distillation softmax temperature")
    parser.add_argument("--lr", type=float, default=None,
                        help="distillation learning rate (default: 1e-4; builtin:minilm and text "
                             "folders 3e-4)")
    parser.add_argument("--train-data", type=Path, default=None, metavar="PATH",
                        help=".npz (or a folder of NAME.npy) with one array per model input "
                             "(+ 'labels'; without labels the model is distilled from its "
                             "unpruned self); for builtin:minilm and Hugging Face encoder "
                             "folders a text file, one sentence per line, added to the "
                             "bundled sentences")
    parser.add_argument("--eval-data", type=Path, default=None, metavar="PATH",
                        help="held-out data for the metric, in --train-data's form (default: "
                             "every fifth training sample is held out; bundled held-out "
                             "sentences for text folders; a built-in's own evaluation set)")
    parser.add_argument("--max-accuracy-drop", type=_fraction, default=None, metavar="X",
                        help="budget: how far the metric may fall from the unpruned model's "
                             "(its unit: points of accuracy, or cosine); exit code 1 when "
                             "the pruned model misses it (the files are still written)")
    parser.add_argument("--protect", type=comma_list(str), default=("first", "last"),
                        help="layers whose output channels stay: first,last, last, first, "
                             "or none")
    parser.add_argument("--semi-structured", action="store_true",
                        help="also impose 2:4 sparsity (pays only on sparse tensor cores)")
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="training batch for Taylor ranking and distillation (default: 64; "
                             "builtin:minilm and text folders 32)")
    parser.add_argument("--latency-batch", type=positive_int,
                        default=int(DEFAULTS["latency_batch"]),
                        help="batch size of the before/after latency measurement")
    parser.add_argument("--latency-seconds", type=positive_float,
                        default=float(DEFAULTS["latency_seconds"]), metavar="SECONDS",
                        help="time spent measuring each model's latency, before and after, "
                             f"in {LATENCY_ROUNDS} interleaved rounds")
    parser.add_argument("--seed", type=int, default=int(DEFAULTS["seed"]),
                        help="seed of the data order and the training")
    parser.add_argument("--train-threads", type=int, default=0,
                        help="torch threads for ranking and distillation (0: torch's choice; "
                             "1 is often faster for small models on a busy machine)")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="DIR")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    # Here and in build_settings, not at the top: turboinfer.prune loads torch.
    from turboinfer.prune.measure import LatencySettings
    from turboinfer.prune.pipeline import prune_model
    from turboinfer.prune.report import format_text

    settings = build_settings(args)
    if args.train_threads > 0:
        import torch  # why: only to set torch's threads; torch is loaded by now

        torch.set_num_threads(args.train_threads)
    with ProgressDisplay() as display:
        display.stage(f"pruning {args.model} to {settings.target_sparsity:g}")
        report = prune_model(args.model, settings, args.output, train_path=args.train_data,
                             eval_path=args.eval_data,
                             latency=LatencySettings(
                                 batch_size=args.latency_batch, rounds=LATENCY_ROUNDS,
                                 seconds_per_round=args.latency_seconds / LATENCY_ROUNDS),
                             max_drop=args.max_accuracy_drop)
    data = report.to_dict()
    if args.json:
        print_json(data)
    else:
        print(format_text(data))
        print(f"files: {', '.join(data['files'].values())}")
    return 1 if report.budget is not None and not report.budget.met else 0


def build_settings(args: argparse.Namespace) -> PruneSettings:
    # why: turboinfer.prune loads torch
    from turboinfer.prune.settings import (
        DistillSettings,
        Protect,
        PruneSettings,
        parse_schedule,
        training_defaults,
    )

    names = [p for p in args.protect if p != "none"]
    unknown = [p for p in names if p not in {m.value for m in Protect}]
    if unknown:
        raise ConfigError(f"unknown --protect value {unknown[0]!r}: use first, last or none")
    # What the user set wins, then the model kind's own training settings, then the
    # general defaults.
    builtin = training_defaults(str(args.model))

    def pick(value: float | None, key: str, default: float) -> float:
        return value if value is not None else builtin.get(key, default)

    return PruneSettings(
        target_sparsity=args.target_sparsity,
        schedule=parse_schedule(args.schedule) if args.schedule else (),
        steps_per_phase=args.steps_per_phase,
        protect=frozenset(Protect(p) for p in names),
        semi_structured=args.semi_structured,
        seed=args.seed,
        batch_size=int(pick(args.batch_size, "batch_size", PruneSettings.batch_size)),
        distill=DistillSettings(epochs=int(pick(args.distill_epochs, "epochs",
                                                DistillSettings.epochs)),
                                temperature=args.temperature,
                                lr=pick(args.lr, "lr", DistillSettings.lr)),
    )
