"""Where the target model's weights live: one process with every expert resident (the
default), one process with experts offloaded behind a cache (``expert_memory_gb``), or
several processes (``tensor_parallel`` / ``expert_parallel``)."""

from __future__ import annotations

import atexit
from pathlib import Path

from turboinfer.llm.config import EngineConfig
from turboinfer.llm.engine import LLMEngine
from turboinfer.llm.experts import load_offloaded_model
from turboinfer.llm.model import LlamaModel
from turboinfer.llm.parallel import ParallelGroup
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
                                               group_size=config.quant_group_size)

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
