"""Decode steps as CUDA graphs, one per (batch size, context) bucket.

At batch 1 a decode step of a small model is hundreds of kernel launches of a few
microseconds each: the GPU waits on the host. A graph records the step once
(``StaticDecodeStep`` over static buffers) and replays it in one launch. A step of n
sequences of at most m blocks replays the graph of the smallest bucket that holds it
(batch sizes 1, 2, 4, 8, then multiples of 8; contexts of 4, 8, 16... blocks), captured
on first use into one memory pool that all the graphs share (they never run at once).
Steps no bucket holds (more sequences than ``max_batch``, prompts, verification) are
not this backend's: ``select.choose_step`` sends them to the general path.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.torch.static_decode import StaticDecodeStep
from turboinfer.llm.model.attention import KVCache
from turboinfer.llm.model.llama import EAGER_OPS, LlamaModel, StepOps

MIN_CONTEXT_BLOCKS = 4


def batch_buckets(max_batch: int) -> list[int]:
    sizes = [b for b in (1, 2, 4) if b < max_batch] + list(range(8, max_batch + 8, 8))
    return [b for b in sizes if b < max_batch] + [max_batch]


def bucket(value: int, buckets: Seq[int]) -> int | None:
    return next((b for b in buckets if b >= value), None)


def context_bucket(blocks: int, max_blocks: int) -> int:
    size = MIN_CONTEXT_BLOCKS
    while size < blocks:
        size *= 2
    return min(size, max_blocks)


class GraphDecoder:
    """Replays a captured decode step; ``capture=False`` runs the same steps eagerly
    (how the bucketing and padding are tested without CUDA). ``ops``: the step's
    elementwise groups, eager or fused (``backends/torch/fused.py``)."""

    def __init__(self, model: LlamaModel, kv_cache: KVCache, *, max_batch: int,
                 scratch_block: int, capture: bool = True, ops: StepOps = EAGER_OPS) -> None:
        self.model = model
        self.ops = ops
        self.kv_cache = kv_cache
        self.batch_sizes = batch_buckets(max_batch)
        self.max_blocks = scratch_block   # every block but the scratch one
        self.scratch_block = scratch_block
        self.capture = capture and kv_cache.k.device.type == "cuda"
        self._steps: dict[tuple[int, int], tuple[StaticDecodeStep, torch.Tensor | None,
                                                 object | None]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None

    @property
    def num_graphs(self) -> int:
        return len(self._steps)

    def fits(self, items: Seq[StepItem]) -> bool:
        return (len(items) <= self.batch_sizes[-1]
                and all(len(it.token_ids) == 1 and it.num_logits == 1 for it in items)
                and max(len(it.block_table) for it in items) <= self.max_blocks)

    @torch.inference_mode()
    def run(self, items: Seq[StepItem]) -> torch.Tensor:
        size = bucket(len(items), self.batch_sizes)
        assert size is not None and self.fits(items), "a step the graphs do not hold"
        blocks = context_bucket(max(len(it.block_table) for it in items), self.max_blocks)
        step, out, graph = self._get(size, blocks)
        step.stage(items)
        if graph is None:
            return step.forward()[:len(items)]
        graph.replay()  # type: ignore[attr-defined]
        assert out is not None
        return out[:len(items)]

    def _get(self, size: int, blocks: int) -> tuple[StaticDecodeStep, torch.Tensor | None,
                                                    object | None]:
        key = (size, blocks)
        if key not in self._steps:
            step = StaticDecodeStep(self.model, self.kv_cache, batch=size, blocks=blocks,
                                    scratch_block=self.scratch_block, ops=self.ops)
            self._steps[key] = (step, *self._record(step)) if self.capture else (step, None,
                                                                                   None)
        return self._steps[key]

    def _record(self, step: StaticDecodeStep) -> tuple[torch.Tensor, object]:
        """Capture ``step.forward`` (CUDA only). Its buffers hold padding rows then, so
        the warm-up and capture runs write only the scratch block."""
        side = torch.cuda.Stream(device=self.kv_cache.k.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):   # warm-up: lazy initialisation stays out of the graph
                step.forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out = step.forward()
        return out, graph
