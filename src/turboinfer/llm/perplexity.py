"""Perplexity of a model on a token stream: the quality measure for quantization."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from turboinfer.llm.model.llama import LlamaModel


@torch.inference_mode()
def perplexity(model: LlamaModel, token_ids: list[int], *, window: int = 256) -> float:
    """exp(mean next-token cross-entropy) over non-overlapping windows of ``window``."""
    if len(token_ids) < 2:
        raise ValueError("perplexity needs at least two tokens")
    window = min(window, model.config.max_position_embeddings)
    device = model.embed_tokens.weight.device
    total, count = 0.0, 0
    for start in range(0, len(token_ids) - 1, window):
        chunk = torch.tensor(token_ids[start:start + window + 1], dtype=torch.long,
                             device=device)
        if len(chunk) < 2:
            break
        inputs, targets = chunk[:-1], chunk[1:]
        logits = model.logits(model(inputs, torch.arange(len(inputs), device=device)))
        total += float(F.cross_entropy(logits, targets, reduction="sum"))
        count += len(targets)
    return math.exp(total / count)
