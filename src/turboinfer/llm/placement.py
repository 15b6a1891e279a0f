"""Where the target model's weights live: one process with every expert resident (the
default), one process with experts offloaded behind a cache (``expert_memory_gb``), or
several processes (``tensor_parallel`` / ``expert_parallel``)."""

from __future__ import annotations

import atexit
from pathlib import Path
from typing import Any

import torch
from torch import nn

from turboinfer.llm.engine.llm_engine import LLMEngine
from turboinfer.llm.model.config import EngineConfig
from turboinfer.llm.model.experts import CachePolicy, load_offloaded_model, moe_report
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.parallel import ParallelGroup
from turboinfer.llm.parallel.collectives import BROADCASTS, AllReduce, backend_for
from turboinfer.llm.parallel.group import world_size


class Placement:
    def __init__(self, folder: Path, config: EngineConfig) -> None:
        self.group: ParallelGroup | None = None
        self._model: LlamaModel | None = None
        if world_size(config) > 1:
            self.group = ParallelGroup(folder, config)
            self._model = self.group.model
            atexit.register(self.close)
        elif config.expert_memory_gb:
            self._model = load_offloaded_model(folder, config.expert_memory_gb,
                                               prefetch=config.expert_prefetch,
                                               quant=config.quant,
                                               group_size=config.quant_group_size,
                                               policy=CachePolicy(config.expert_cache_policy))

    def take_model(self) -> LlamaModel | None:
        """The target model if it loads its own way (once), else None: load normally."""
        model, self._model = self._model, None
        return model

    def attach(self, engine: LLMEngine) -> None:
        if self.group is not None:
            self.group.attach(engine)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()


def placement_report(model: nn.Module, config: EngineConfig, output_tokens: int,
                     ) -> dict[str, Any]:
    """The MoE counters (load balance, expert cache, prefetch) and the parallel layout
    with rank 0's all-reduce totals, for ``llm bench --json``."""
    reduce = AllReduce.stats
    world = world_size(config)
    return {
        "moe": moe_report(model, output_tokens),
        "parallel": {
            "tensor_parallel": config.tensor_parallel,
            "expert_parallel": config.expert_parallel,
            "processes": world,
            "backend": backend_for(torch.device(config.device)) if world > 1 else None,
            "all_reduce": reduce.to_dict(),
            "step_broadcast": BROADCASTS.to_dict(),
            "all_reduce_ms_per_token": (1000 * reduce.seconds / output_tokens
                                        if output_tokens else 0.0),
        },
    }
