"""Where a pruning target comes from: a built-in, or the user's own PyTorch source.

Two kinds of model arrive here. A built-in (``builtin:NAME``) brings everything from its
zoo entry. A user's own PyTorch source brings the module, and the rest comes from the
data the user gives (``--train-data``, ``--eval-data``):

- ``package.module:factory``: arrays by input name (``.npz``, or a folder of ``NAME.npy``),
  with ``labels`` when the task has them. The model is pruned with its own class, so its
  layers are found as the built-ins' are.
- a Hugging Face encoder folder: text, one sentence per line, tokenized with the folder's
  own tokenizer. Without ``--train-data`` it gets the recipe ``builtin:minilm`` uses (the
  bundled English sentences, their halves and recombinations). A feature-extraction
  model is distilled and judged on its mean-pooled, normalized embedding, as sentence
  encoders are used; what is exported keeps the folder's own output.

TorchScript and ``torch.export`` files hold compiled graphs, not layer modules, so the
pruner has nothing to cut in them: they are refused with that reason.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.models import builtin_onnx, metrics, resolve_model
from turboinfer.models.refs import BUILTIN, PROGRAM_SUFFIX, is_factory, is_hf_folder, is_torch_file
from turboinfer.models.sources import InputSpec, factory_source, parameter_names
from turboinfer.models.zoo import EvalSet, Feeds
from turboinfer.prune.api import EvalFn
from turboinfer.prune.data import LABELS_KEY, TrainData
from turboinfer.prune.settings import Objective
from turboinfer.prune.target import PruneTarget, Signature, module_runner
from turboinfer.prune.text_target import text_target
from turboinfer.prune.zoo import task_for

# Every fifth sample is held out for the metric when no --eval-data is given.
HOLDOUT_EVERY = 5


def prune_target(
    ref: str,
    *,
    train_path: Path | None = None,
    eval_path: Path | None = None,
    batch_size: int = 64,
    seed: int = 0,
) -> PruneTarget:
    """The target ``ref`` names; a one-line ``ConfigError`` for what cannot be pruned."""
    if ref.startswith(BUILTIN):
        return _builtin(ref, train_path, eval_path, batch_size, seed)
    if is_hf_folder(ref):
        return text_target(Path(ref).expanduser(), train_path, eval_path, batch_size, seed)
    if is_torch_file(ref):
        kind = "torch.export program" if Path(ref).suffix == PROGRAM_SUFFIX else "TorchScript file"
        raise ConfigError(
            f"{ref} is a {kind}: a compiled graph holds no layer modules to prune; give the "
            "model's class as package.module:factory (or a Hugging Face folder)"
        )
    if is_factory(ref):
        return _factory(ref, train_path, eval_path, batch_size, seed)
    if Path(ref).expanduser().suffix == ".onnx" or Path(ref).expanduser().is_file():
        raise ConfigError(
            f"pruning needs the PyTorch model, and {ref} is an ONNX file: give "
            "package.module:factory, a Hugging Face folder or builtin:NAME"
        )
    raise ConfigError(
        f"cannot prune {ref!r}: use builtin:NAME, package.module:factory or a Hugging Face "
        "model folder"
    )


def _builtin(
    ref: str, train_path: Path | None, eval_path: Path | None, batch_size: int, seed: int
) -> PruneTarget:
    if eval_path is not None:
        raise ConfigError(f"{ref} is judged on its own evaluation set: leave out --eval-data")
    entry = resolve_model(ref).entry
    assert entry is not None  # a builtin: reference always has its entry
    task = task_for(entry, train_path=train_path, batch_size=batch_size, seed=seed)
    module = entry.build()
    if not isinstance(module, nn.Module):
        raise ConfigError(f"builtin {entry.name} did not build a torch.nn.Module")

    def examples() -> tuple[torch.Tensor, ...]:
        feeds = entry.example_inputs(2)
        return tuple(torch.from_numpy(np.asarray(feeds[n])) for n in entry.input_names)

    return PruneTarget(
        name=entry.name, module=module, objective=task.objective,
        example_inputs=task.example_inputs, train_data=task.train_data, eval_fn=task.eval_fn,
        metric_name=entry.metric.name,
        signature=Signature(entry.input_names, entry.output_names, entry.dynamic_axes),
        latency_feeds=entry.example_inputs, export_examples=examples,
        original_onnx=builtin_onnx(entry),
    )


def _factory(
    ref: str, train_path: Path | None, eval_path: Path | None, batch_size: int, seed: int
) -> PruneTarget:
    if train_path is None:
        raise ConfigError(
            f"pruning {ref} needs its training data: --train-data FILE.npz (or a folder of "
            "NAME.npy) with one array per model input, plus 'labels' when there are any"
        )
    arrays = read_arrays(train_path, "training")
    count = len([k for k in arrays if k != LABELS_KEY])

    def specs(model: nn.Module) -> list[InputSpec]:
        # The data's own shapes are the example inputs, in forward's order and names.
        names = parameter_names(model, count)
        chosen = _select(arrays, tuple(names), train_path)
        return [InputSpec(n, (2, *chosen[n].shape[1:]), chosen[n].dtype.name) for n in names]

    source = factory_source(ref, specs)
    names = source.input_names
    module = source.runnable
    train = _select(arrays, names, train_path)
    if eval_path is not None:
        held = _select(read_arrays(eval_path, "evaluation"), names, eval_path)
    else:
        train, held = holdout(train)
    labels = train.pop(LABELS_KEY, None)
    data = TrainData(train, labels, batch_size=batch_size, seed=seed)
    output = _run_module(module, names, held)
    objective = Objective.LOGITS if _is_logits(output) else Objective.EMBEDDING
    metric_name, eval_fn = _metric(module, names, held, output, objective)
    return PruneTarget(
        name=source.name, module=module, objective=objective,
        example_inputs=_tensors(train, names, 2), train_data=data, eval_fn=eval_fn,
        metric_name=metric_name,
        signature=Signature(names, source.output_names, source.dynamic_axes),
        latency_feeds=lambda batch: _rows({n: held[n] for n in names}, batch),
        export_examples=lambda: _tensors(train, names, 2),
    )


def read_arrays(path: Path, role: str) -> dict[str, np.ndarray]:
    """An ``.npz`` or a folder of ``NAME.npy``: arrays with samples on the first axis."""
    if path.is_dir():
        files = sorted(path.glob("*.npy"))
        if not files:
            raise ConfigError(f"{role} data folder {path} holds no NAME.npy files")
        try:
            return {f.stem: np.load(f, allow_pickle=False) for f in files}
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{role} data in {path} is not readable: {exc}") from None
    if not path.is_file():
        raise ConfigError(f"{role} data file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{role} data file {path} is not a readable .npz: {exc}") from None


def _select(arrays: dict[str, np.ndarray], names: tuple[str, ...], path: Path) -> Feeds:
    missing = [n for n in names if n not in arrays]
    if missing:
        raise InvalidInputError(
            f"{path} lacks input {', '.join(missing)} (it has {', '.join(sorted(arrays))})")
    chosen = {n: arrays[n] for n in names}
    if LABELS_KEY in arrays:
        chosen[LABELS_KEY] = arrays[LABELS_KEY]
    sizes = {len(v) for v in chosen.values()}
    if len(sizes) != 1:
        raise InvalidInputError(f"the arrays in {path} differ in sample count")
    return chosen


def holdout(arrays: Feeds) -> tuple[Feeds, Feeds]:
    """Every ``HOLDOUT_EVERY``-th sample held out for the metric, the rest to train on."""
    count = len(next(iter(arrays.values())))
    if count < 2 * HOLDOUT_EVERY:
        raise InvalidInputError(
            f"the training data has {count} samples: too few to hold out an evaluation "
            f"set (at least {2 * HOLDOUT_EVERY}); pass --eval-data"
        )
    held = np.arange(count) % HOLDOUT_EVERY == HOLDOUT_EVERY - 1
    return ({k: v[~held] for k, v in arrays.items()}, {k: v[held] for k, v in arrays.items()})


def _tensors(arrays: Feeds, names: tuple[str, ...], count: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.ascontiguousarray(arrays[n][:count])) for n in names)


def _rows(feeds: Feeds, count: int) -> Feeds:
    """``count`` samples of ``feeds``, repeated from the start when there are fewer."""
    size = len(next(iter(feeds.values())))
    index = np.arange(count) % size
    return {k: np.ascontiguousarray(v[index]) for k, v in feeds.items()}


def _run_module(module: nn.Module, names: tuple[str, ...], feeds: Feeds) -> np.ndarray:
    """The module's (first) output over ``feeds``, in batches of ``metrics.BATCH``."""
    return metrics.collect(module_runner(module, names), {n: feeds[n] for n in names},
                           output=None)


def _is_logits(output: np.ndarray) -> bool:
    return output.ndim == 2 and output.shape[1] >= 2


def _metric(
    module: nn.Module, names: tuple[str, ...], held: Feeds, reference: np.ndarray,
    objective: Objective,
) -> tuple[str, EvalFn]:
    """Accuracy on labels where they exist, else closeness to the unpruned model."""
    inputs = {n: held[n] for n in names}
    labels = held.get(LABELS_KEY)
    if labels is not None and objective is Objective.LOGITS:
        evalset = EvalSet(inputs, labels.astype(np.int64))
        return "accuracy", lambda m: metrics.accuracy(module_runner(m, names), evalset,
                                                      output="output")
    if objective is Objective.LOGITS:
        # Without labels, the unpruned model's classes are the answers to keep.
        evalset = EvalSet(inputs, reference.argmax(axis=-1))
        return "agreement", lambda m: metrics.accuracy(module_runner(m, names), evalset,
                                                       output="output")
    flat = EvalSet(inputs, reference.reshape(len(reference), -1))

    def cosine(m: nn.Module) -> float:
        run = module_runner(m, names)
        return metrics.mean_cosine(
            lambda feeds: {"output": run(feeds)["output"].reshape(len(feeds[names[0]]), -1)},
            flat, output="output")

    return "cosine", cosine


