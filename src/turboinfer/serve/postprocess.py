"""Post-processing in the server: the model's outputs turned into what a client reads.

- ``topk``: BYTES ``[N, k]`` of ``"score:index:label"``, scores softmax probabilities;
- ``argmax``: INT64 ``[N]`` class indices;
- ``embedding``: FP32 ``[N, H]``, mean-pooled over the request's attention mask when the
  output is per token, L2-normalized when asked;
- the classification extension as Triton has it: an output requested with
  ``parameters: {"classification": k}`` comes back as BYTES ``[N, k]`` of
  ``"value:index[:label]"``, the raw output values, highest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.serve.prepost_config import Postprocess


def read_labels(path: str) -> tuple[str, ...]:
    try:
        text = Path(path).read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read label file {path}: {exc}") from None
    return tuple(line.strip() for line in text.splitlines())


def top_indices(values: np.ndarray, k: int) -> np.ndarray:
    """``[..., C]`` -> ``[..., min(k, C)]`` indices of the largest values, largest first."""
    k = min(k, values.shape[-1])
    part = np.argpartition(-values, k - 1, axis=-1)[..., :k]
    order = np.argsort(-np.take_along_axis(values, part, axis=-1), axis=-1, kind="stable")
    return np.take_along_axis(part, order, axis=-1)


def _strings(values: np.ndarray, indices: np.ndarray, labels: Sequence[str]) -> np.ndarray:
    picked = np.take_along_axis(values, indices, axis=-1)
    out = np.empty(indices.shape, dtype=object)
    flat_out, flat_values, flat_index = out.reshape(-1), picked.reshape(-1), indices.reshape(-1)
    for i, (value, index) in enumerate(zip(flat_values.tolist(), flat_index.tolist(),
                                           strict=True)):
        label = labels[index] if index < len(labels) else ""
        text = f"{value:f}:{index}:{label}" if label else f"{value:f}:{index}"
        flat_out[i] = text.encode()
    return out


def classification(name: str, values: np.ndarray, k: int,
                   labels: Sequence[str]) -> np.ndarray:
    """Triton's classification extension over output ``name`` (raw values, no softmax)."""
    if values.dtype.kind not in "fiub" or values.ndim < 1:
        raise InvalidInputError(f"output {name!r}: classification needs a numeric output, "
                                f"it is {values.dtype} of shape {list(values.shape)}")
    flat = values.reshape(values.shape[0], -1) if values.ndim > 1 else values
    return _strings(flat, top_indices(flat, k), labels)


def softmax(values: np.ndarray) -> np.ndarray:
    shifted = values.astype(np.float32) - values.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    result: np.ndarray = exp / exp.sum(axis=-1, keepdims=True)
    return result


def topk(values: np.ndarray, k: int, labels: Sequence[str]) -> np.ndarray:
    probabilities = softmax(values)
    return _strings(probabilities, top_indices(probabilities, k), labels)


def argmax(values: np.ndarray) -> np.ndarray:
    return np.argmax(values, axis=-1).astype(np.int64)


def embedding(values: np.ndarray, mask: np.ndarray | None, step: Postprocess) -> np.ndarray:
    if step.pool == "mean":
        if mask is None or values.ndim != 3:
            raise InvalidInputError(f"output {step.output!r}: mean pooling needs a [N, S, H] "
                                    f"output and the request's {step.mask!r}")
        tokens = values[:, : mask.shape[1]]  # the batch may be padded past this request
        weights = mask[:, : tokens.shape[1], None].astype(np.float32)
        values = (tokens * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    values = values.astype(np.float32, copy=False)
    if step.normalize:
        norms = np.linalg.norm(values, axis=-1, keepdims=True)
        values = values / np.maximum(norms, 1e-12)
    return values


def run_step(step: Postprocess, outputs: dict[str, np.ndarray], inputs: dict[str, np.ndarray],
             labels: Sequence[str]) -> np.ndarray:
    values = outputs[step.output]
    if step.kind == "topk":
        return topk(values, step.k, labels)
    if step.kind == "argmax":
        return argmax(values)
    return embedding(values, inputs.get(step.mask), step)
