"""The interface between the engine and what runs a step.

A step of continuous batching packs several sequences' work into one forward: prompt
chunks (prefill) and single new tokens (decode) side by side. The engine describes each
sequence's share as a ``StepItem`` and hands the whole step to a ``StepBackend`` in one
``run`` call, which returns the logits the engine samples from. One entry point, not a
prefill and a decode one: a mixed step is one forward, and splitting it in two would
change both its cost and its rounding. A backend tells an item's kind from its shape
(one token at a cached position is a decode step).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class StepItem:
    """Feed ``token_ids`` at positions ``start...``; return the last ``num_logits`` logits."""

    token_ids: list[int]
    start: int
    block_table: list[int]
    num_logits: int


class StepBackend(Protocol):
    """Runs the forward of one step over the model's paged KV cache: writes every fed
    token's keys and values to the cache (its slots follow from ``block_table``) and
    returns ``[sum(num_logits), vocab]`` float logits, item by item in order."""

    def run(self, items: Seq[StepItem]) -> torch.Tensor: ...
