"""Training data for Taylor ranking and distillation: named arrays, batched as tensors.

The pipeline accepts any re-iterable of ``Batch``; ``TrainData`` is the one turboinfer
builds from arrays (a zoo entry's training split, an ``.npz`` file, tokenized text).
Each pass over it reshuffles, so epochs see the samples in a different order. Token data
can carry each sample's length: batches then hold samples of similar length, cut to the
longest of them, instead of every batch padded to the longest text of the whole set.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence, Sized
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from turboinfer.errors import ConfigError, InvalidInputError

# Positional model inputs, and the hard labels when the data has them.
Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor | None]
LABELS_KEY = "labels"


@dataclass
class TrainData:
    """Arrays with samples on the first axis, in the order the model's ``forward`` takes them.

    Mutable on purpose: the epoch counter moves the shuffle on at every pass.
    ``lengths`` (real tokens per sample, padding at the end of axis 1) turns on length
    buckets.
    """

    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None = None
    batch_size: int = 64
    seed: int = 0
    lengths: np.ndarray | None = None
    _epoch: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if not self.inputs:
            raise InvalidInputError("training data has no inputs")
        sizes = {name: len(value) for name, value in self.inputs.items()}
        if self.labels is not None:
            sizes[LABELS_KEY] = len(self.labels)
        if self.lengths is not None:
            sizes["lengths"] = len(self.lengths)
        if len(set(sizes.values())) != 1:
            described = ", ".join(f"{name}: {size}" for name, size in sizes.items())
            raise InvalidInputError(f"training arrays differ in sample count ({described})")
        if len(self) == 0:
            raise InvalidInputError("training data has no samples")

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    @property
    def num_batches(self) -> int:
        return -(-len(self) // self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        rng = np.random.default_rng((self.seed, self._epoch))
        self._epoch += 1
        for index in self._batch_indices(rng):
            width = None if self.lengths is None else max(int(self.lengths[index].max()), 1)
            inputs = tuple(torch.from_numpy(np.ascontiguousarray(_cut(v[index], width)))
                           for v in self.inputs.values())
            labels = None if self.labels is None else torch.from_numpy(self.labels[index])
            yield inputs, labels

    def _batch_indices(self, rng: np.random.Generator) -> list[np.ndarray]:
        if self.lengths is None:
            order = rng.permutation(len(self))
        else:
            # Sorted by length with random tie-breaks, then the batches shuffled: samples
            # of one length still meet different partners, and no batch is mostly padding
            # (builtin:minilm's training texts average 16 tokens, the longest has 128).
            order = np.lexsort((rng.random(len(self)), self.lengths))
        chunks = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        if self.lengths is not None:
            chunks = [chunks[i] for i in rng.permutation(len(chunks))]
        return chunks


def _cut(array: np.ndarray, width: int | None) -> np.ndarray:
    """Token arrays ``[N, S, ...]`` cut to ``width`` positions; others unchanged."""
    return array if width is None or array.ndim < 2 else array[:, :width]


def reiterable(data: Iterable[Batch]) -> Iterable[Batch]:
    """``data`` itself if it can be iterated again, else its batches kept in a list."""
    return list(data) if iter(data) is data else data


def batch_count(data: Iterable[Batch]) -> int | None:
    """Batches in one pass over ``data``, where that is known without iterating."""
    if isinstance(data, TrainData):
        return data.num_batches
    if isinstance(data, Sized):
        return len(data)
    return None


def first_batches(data: Iterable[Batch], count: int) -> list[Batch]:
    batches = []
    for batch in data:
        batches.append(batch)
        if len(batches) == count:
            break
    return batches


def load_arrays(path: Path, input_names: Sequence[str], *, batch_size: int, seed: int) -> TrainData:
    """An ``.npz`` with one array per model input (by name) and optionally ``labels``."""
    if not path.is_file():
        raise ConfigError(f"training data file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"training data file {path} is not a readable .npz: {exc}") from None
    missing = [name for name in input_names if name not in arrays]
    if missing:
        raise InvalidInputError(
            f"training data {path} lacks input {', '.join(missing)} "
            f"(it has {', '.join(sorted(arrays)) or 'no arrays'})"
        )
    inputs = {name: arrays[name] for name in input_names}
    return TrainData(inputs, arrays.get(LABELS_KEY), batch_size=batch_size, seed=seed)


def load_text(path: Path) -> tuple[str, ...]:
    """One sentence per non-empty line, for distilling sentence encoders."""
    if not path.is_file():
        raise ConfigError(f"training text file {path} does not exist")
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"training text file {path} is not readable UTF-8: {exc}") from None
    lines = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not lines:
        raise InvalidInputError(f"training text file {path} has no sentences")
    return lines


def check_fits(model: torch.nn.Module, data: Iterable[Batch]) -> torch.Tensor:
    """Run one training batch through ``model``; name the mismatch if it does not fit.

    Returns the output, so callers can check labels against it.
    """
    batch = first_batches(data, 1)
    if not batch:
        raise InvalidInputError("training data yields no batches")
    inputs, labels = batch[0]
    shapes = ", ".join(str(list(t.shape)) for t in inputs)
    try:
        with torch.no_grad():
            output = model.eval()(*inputs)
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidInputError(
            f"training data does not fit the model (inputs of shape {shapes}): {first_line}"
        ) from None
    if not isinstance(output, torch.Tensor):
        raise InvalidInputError("the model must return one tensor (logits or embeddings)")
    if labels is not None:
        _check_labels(labels, output)
    return output


def _check_labels(labels: torch.Tensor, output: torch.Tensor) -> None:
    if labels.dtype not in (torch.int64, torch.int32) or labels.ndim != 1:
        raise InvalidInputError(
            f"training labels must be a 1-D integer array, got {labels.dtype} {list(labels.shape)}"
        )
    classes = output.shape[-1]
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise InvalidInputError(
            f"training labels run from {int(labels.min())} to {int(labels.max())} "
            f"but the model has {classes} outputs"
        )
