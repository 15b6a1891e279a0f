"""What pruning needs from a built-in model: training data, tracing inputs, an evaluator.

A table keyed by model name says where each entry's training data comes from; an entry
without one needs ``--train-data``. Evaluation is the entry's own metric, run on the
torch module, so the numbers match what ``optimize`` reports for the ONNX file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from turboinfer.errors import ConfigError
from turboinfer.models import digits, minilm
from turboinfer.models.zoo import RunFn, ZooEntry, get_entry
from turboinfer.prune.api import EvalFn
from turboinfer.prune.data import TrainData, load_arrays, load_text
from turboinfer.prune.settings import Objective

RESNET_TRAIN_IMAGES = 64  # random weights: these images only feed Taylor and distillation
# Recombined bundled sentences for builtin:minilm: with the bundled ones and their halves
# about 51,000 texts of ~17 tokens, one epoch ~14 minutes on one core of a Xeon.
RECOMBINED = 50_000


@dataclass(frozen=True)
class PruneTask:
    entry: ZooEntry
    objective: Objective
    example_inputs: tuple[torch.Tensor, ...]
    train_data: TrainData
    eval_fn: EvalFn


def _digits(extra: Path | None, batch: int, seed: int) -> TrainData:
    split = digits.data()  # the zoo's fixed split: the evaluation images are never trained on
    return TrainData({"input": split.train_x}, split.train_y, batch_size=batch, seed=seed)


def _resnet(name: str) -> Callable[[Path | None, int, int], TrainData]:
    def load(extra: Path | None, batch: int, seed: int) -> TrainData:
        images = get_entry(name).calibration(RESNET_TRAIN_IMAGES)
        return TrainData(dict(images), None, batch_size=batch, seed=seed)

    return load


def _minilm(extra: Path | None, batch: int, seed: int) -> TrainData:
    bundled = minilm.calibration_sentences()
    texts = bundled + (load_text(extra) if extra else ())
    texts += halves(texts) + recombined(bundled, RECOMBINED, seed)
    feeds = minilm.tokenize(texts)
    # Lengths make length buckets: a batch is cut to its own longest text.
    return TrainData(dict(feeds), None, batch_size=batch, seed=seed,
                     lengths=feeds["attention_mask"].sum(axis=1))


def halves(texts: tuple[str, ...], min_words: int = 6) -> tuple[str, ...]:
    """Each longer sentence's first and second half, as extra distillation inputs.

    A few hundred sentences over-fit a pruned encoder (train cosine 0.93, held-out 0.85
    on builtin:minilm); the halves are new inputs at no cost and lifted held-out cosine
    by about 0.025 there.
    """
    parts: list[str] = []
    for text in texts:
        words = text.split()
        if len(words) >= min_words:
            middle = len(words) // 2
            parts += [" ".join(words[:middle]), " ".join(words[middle:])]
    return tuple(parts)


def recombined(texts: tuple[str, ...], count: int, seed: int) -> tuple[str, ...]:
    """``count`` new texts, each the start of one sentence joined to the end of another.

    The zoo's metric is held-out sentences of the bundled set (everyday English); its
    training two thirds are a few hundred sentences, and text in that style is what the
    pruned encoder must relearn. Joining random cuts of two of them gives tens of
    thousands of inputs in that style, labelled by the teacher like any other: on
    builtin:minilm at 30 %, held-out cosine after 400 batches rose from 0.885 to 0.916
    with 40,000 of them in place of most of 20,000 docstring sentences.
    """
    words = [t.split() for t in texts if t.split()]
    rng = np.random.default_rng((seed, count))
    first, second = rng.integers(0, len(words), (2, count))
    out = []
    for i, j in zip(first, second, strict=True):
        head, tail = words[i], words[j]
        start = int(rng.integers(1, len(head) + 1))
        end = int(rng.integers(0, len(tail)))
        out.append(" ".join(head[:start] + tail[end:]))
    return tuple(out)


TRAIN_DATA: dict[str, Callable[[Path | None, int, int], TrainData]] = {
    "digits-cnn": _digits,
    "digits-dsconv": _digits,
    "resnet18": _resnet("resnet18"),
    "resnet50": _resnet("resnet50"),
    "minilm": _minilm,
}
# Where extra text is added to the bundled data instead of replacing it.
TEXT_DATA = frozenset({"minilm"})
OBJECTIVES = {"embeddings": Objective.EMBEDDING}


def task_for(
    entry: ZooEntry, *, train_path: Path | None = None, batch_size: int = 64, seed: int = 0
) -> PruneTask:
    if train_path is not None and entry.name not in TEXT_DATA:
        data = load_arrays(train_path, entry.input_names, batch_size=batch_size, seed=seed)
    elif entry.name in TRAIN_DATA:
        data = TRAIN_DATA[entry.name](train_path, batch_size, seed)
    else:
        raise ConfigError(f"builtin {entry.name} has no training data: pass --train-data FILE.npz")
    example = entry.example_inputs(2)
    tensors = tuple(torch.from_numpy(np.asarray(example[n])) for n in entry.input_names)
    evalset = entry.evaluation()
    return PruneTask(
        entry=entry,
        objective=OBJECTIVES.get(entry.output_names[0], Objective.LOGITS),
        example_inputs=tensors,
        train_data=data,
        eval_fn=lambda module: entry.metric.compute(torch_run(module, entry), evalset),
    )


def torch_run(module: nn.Module, entry: ZooEntry) -> RunFn:
    """The entry's metric drives engines by name; this drives the torch module the same way."""
    output = entry.output_names[0]

    def run(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.no_grad():
            args = (torch.from_numpy(np.asarray(feeds[n])) for n in entry.input_names)
            return {output: module(*args).numpy()}

    return run

