"""A Hugging Face encoder folder as a pruning target: text in, the folder's tokenizer.

Training text is the user's (``--train-data FILE.txt``, one text per line) added to the
recipe ``builtin:minilm`` is distilled with: the bundled English sentences, their halves
and recombinations (``prune/zoo.py`` says why each helps). The metric is on held-out
text never trained on: ``--eval-data FILE.txt``, else the bundled held-out sentences.

A feature-extraction encoder is trained and judged through ``MeanPooled``: its token
states mean-pooled over the real tokens and normalized, the sentence embedding that
sentence-transformers and the built-in MiniLM give. A classifier keeps its logits.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import torch
from torch import nn

from turboinfer.errors import ModelLoadError
from turboinfer.models import metrics, minilm
from turboinfer.models.hf import load_hf_source, quiet_hub
from turboinfer.models.sources import one_line
from turboinfer.models.zoo import EvalSet, Feeds, RunFn
from turboinfer.prune.data import TrainData
from turboinfer.prune.settings import Objective
from turboinfer.prune.target import TEXT_LENGTH, PruneTarget, Signature, module_runner, text_lines
from turboinfer.prune.zoo import RECOMBINED, halves, recombined


class MeanPooled(nn.Module):
    """The encoder's token states, mean-pooled over the attention mask and normalized."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                *rest: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids, attention_mask, *rest)  # [B, S, H]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, S, 1]
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)  # [B, H]
        return nn.functional.normalize(pooled, p=2.0, dim=-1)


def text_target(
    folder: Path, train_path: Path | None, eval_path: Path | None, batch_size: int, seed: int
) -> PruneTarget:
    source = load_hf_source(folder)
    names = source.input_names
    tokenize = partial(_tokenize, _tokenizer(folder), names)
    bundled = minilm.calibration_sentences()
    texts = bundled + (text_lines(train_path, "training") if train_path else ())
    texts += halves(texts) + recombined(bundled, RECOMBINED, seed)
    train = tokenize(texts)
    data = TrainData(train, None, batch_size=batch_size, seed=seed,
                     lengths=train["attention_mask"].sum(axis=1))
    held = tokenize(text_lines(eval_path, "evaluation") if eval_path
                    else minilm.evaluation_sentences())
    pooled = source.output_names[0] == "last_hidden_state"
    module: nn.Module = MeanPooled(source.runnable) if pooled else source.runnable
    run = module_runner(module, names)
    evalset = EvalSet(held, _outputs(run, held))
    if pooled:
        metric_name, objective = "cosine", Objective.EMBEDDING
        compute = partial(metrics.mean_cosine, output="output", prepare=minilm.trim_padding)
    else:
        # Without labels, the unpruned classifier's classes are the answers to keep.
        evalset = EvalSet(held, evalset.labels.argmax(axis=-1))  # type: ignore[union-attr]
        metric_name, objective = "agreement", Objective.LOGITS
        compute = partial(metrics.accuracy, output="output", prepare=minilm.trim_padding)
    sample = minilm.sentences()

    def latency_feeds(batch: int) -> Feeds:
        return tokenize([sample[i % len(sample)] for i in range(batch)], TEXT_LENGTH)

    def examples() -> tuple[torch.Tensor, ...]:
        feeds = tokenize(sample[:2])
        return tuple(torch.from_numpy(feeds[n]) for n in names)

    return PruneTarget(
        name=source.name, module=module, objective=objective,
        example_inputs=examples(), train_data=data,
        eval_fn=lambda m: compute(module_runner(m, names), evalset),
        metric_name=metric_name,
        signature=Signature(names, source.output_names, source.dynamic_axes),
        latency_feeds=latency_feeds, export_examples=examples,
        exported=_encoder if pooled else (lambda m: m),
    )


def _encoder(module: nn.Module) -> nn.Module:
    """What is exported from a ``MeanPooled`` training wrapper: the folder's own model."""
    assert isinstance(module, MeanPooled)
    return module.encoder


def _tokenizer(folder: Path) -> object:
    from transformers import AutoTokenizer  # seconds to import: only for a folder

    try:
        with quiet_hub():
            return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (ValueError, OSError, KeyError) as exc:
        raise ModelLoadError(f"cannot load the tokenizer in {folder}: {one_line(exc)}") from None


def _tokenize(tokenizer: object, names: tuple[str, ...], texts: list[str] | tuple[str, ...],
              length: int | None = None) -> Feeds:
    """Ids, mask (and zero token types) ``[N, length]``; ``None`` pads to the longest text."""
    encoded = tokenizer(list(texts), truncation=True,  # type: ignore[operator]
                        max_length=length or TEXT_LENGTH)["input_ids"]
    width = length or max(len(ids) for ids in encoded)
    pad = getattr(tokenizer, "pad_token_id", None) or 0
    feeds = {"input_ids": np.full((len(encoded), width), pad, dtype=np.int64),
             "attention_mask": np.zeros((len(encoded), width), dtype=np.int64),
             "token_type_ids": np.zeros((len(encoded), width), dtype=np.int64)}
    for row, ids in enumerate(encoded):
        feeds["input_ids"][row, : len(ids)] = ids
        feeds["attention_mask"][row, : len(ids)] = 1
    return {n: feeds[n] for n in names}


def _outputs(run: RunFn, feeds: Feeds) -> np.ndarray:
    """Reference outputs, in the trimmed batches the metric runs."""
    evalset = EvalSet(feeds, np.zeros(len(feeds["input_ids"])))
    parts = [run(batch)["output"] for batch, _ in
             metrics.batches(evalset, prepare=minilm.trim_padding)]
    return np.concatenate(parts)
