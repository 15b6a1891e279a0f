"""Rank 0 (this process: scheduler, sampler, engine) and its worker processes.

``ParallelGroup`` spawns ranks 1..N-1, joins the group as rank 0 and shards the
model for itself; ``attach`` tells the workers how many KV-cache blocks rank 0's engine
planned and makes its runner broadcast each step's inputs before running the step, so
every rank runs the same forward on its shard. Workers (``worker.py``) keep their own
KV cache (their share of the heads). The ranks run on the CPU (gloo) or one GPU each
(NCCL), in float32 on the CPU's measured kernels or on the general path in any dtype,
as ``LLM`` resolved ``device``, ``dtype`` and ``backend`` in the engine config.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Sequence as Seq
from pathlib import Path

import torch
import torch.distributed as dist

from turboinfer.errors import ConfigError, ModelLoadError
from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.device import rank_device, resolve_dtype, runs_general
from turboinfer.llm.backends.runner import ModelRunner
from turboinfer.llm.engine.llm_engine import LLMEngine
from turboinfer.llm.model.config import EngineConfig, ModelConfig
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.loader import load_model
from turboinfer.llm.parallel.collectives import broadcast_step, init_group
from turboinfer.llm.parallel.sharding import check_layout, shard_model
from turboinfer.ports import free_port


def world_size(config: EngineConfig) -> int:
    return max(config.tensor_parallel, config.expert_parallel)


def placed(config: EngineConfig, rank: int) -> tuple[torch.device, torch.dtype, bool]:
    """Rank ``rank``'s device, dtype and whether it runs the general path."""
    device = rank_device(torch.device(config.device), rank)
    dtype = resolve_dtype(config.dtype, device)
    return device, dtype, runs_general(device, dtype, config.backend)


def load_shard(folder: Path, config: EngineConfig, rank: int) -> LlamaModel:
    """Rank ``rank``'s shard where it runs: float32 in CPU memory for the CPU's kernels,
    else in the config's dtype on the rank's device."""
    device, dtype, general = placed(config, rank)
    full = load_model(folder, dtype=dtype if general else torch.float32)
    check_layout(full.config, config.tensor_parallel, config.expert_parallel)
    shard = shard_model(full, rank, config.tensor_parallel, config.expert_parallel)
    del full
    return shard.to(device)


class BroadcastingRunner(ModelRunner):
    """Rank 0's runner: sends the step's inputs to the workers, then runs its shard."""

    def __init__(self, inner: ModelRunner) -> None:
        self.__dict__.update(inner.__dict__)

    def run(self, items: Seq[StepItem]) -> torch.Tensor:
        broadcast_step(list(items))
        return super().run(items)


class ParallelGroup:
    """The workers of one model run across ``world`` processes, seen from rank 0."""

    def __init__(self, folder: Path, config: EngineConfig) -> None:
        self.world = world_size(config)
        if config.expert_memory_gb:
            raise ConfigError("expert offload runs in one process; drop --expert-memory-gb "
                              "or the parallel flags")
        if dist.is_initialized():
            raise ConfigError("a parallel model is already running in this process")
        # Refuse a split the shape cannot take before any process starts.
        check_layout(ModelConfig.from_file(Path(folder) / "config.json"),
                     config.tensor_parallel, config.expert_parallel)
        port = free_port()
        settings = json.dumps(dataclasses.asdict(config), default=str)
        # Fresh interpreters (not fork: torch's threads; not multiprocessing's spawn: it
        # re-imports the caller's __main__).
        self.workers = [subprocess.Popen(
            [sys.executable, "-m", "turboinfer.llm.parallel.worker", str(rank),
             str(self.world), str(port), str(folder), str(os.getpid()), settings],
            stdout=subprocess.PIPE, text=True)
            for rank in range(1, self.world)]
        self._closed = False
        try:
            self.model = load_shard(folder, config, 0)
            # Each worker says "loaded" before joining the group: one that failed to
            # load exits instead, and rank 0 reports it rather than waiting in the
            # group's rendezvous for a rank that never comes.
            for rank, proc in enumerate(self.workers, start=1):
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != "loaded":
                    raise ModelLoadError(f"parallel worker rank {rank} failed to load "
                                         f"{folder} (exit code {proc.wait()}; its error is "
                                         "above)")
            init_group(0, self.world, port, placed(config, 0)[0])
            dist.barrier()
        except BaseException:
            self.close()
            raise

    def attach(self, engine: LLMEngine) -> None:
        """After rank 0's engine planned its memory (on CUDA, profiling a step the
        workers ran with it): the workers allocate the same number of blocks."""
        broadcast_step(engine.runner.kv_cache.num_blocks)
        engine.runner = BroadcastingRunner(engine.runner)

    def close(self) -> None:
        """Stop the workers (they finish the step in flight first); idempotent."""
        if self._closed:
            return
        self._closed = True
        if dist.is_initialized():
            if all(p.poll() is None for p in self.workers):
                broadcast_step(None)
            dist.destroy_process_group()
        for proc in self.workers:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
