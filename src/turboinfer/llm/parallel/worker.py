"""A worker rank: ``python -m turboinfer.llm.parallel.worker RANK WORLD PORT FOLDER
PARENT_PID SETTINGS_JSON``. It loads its shard (quantized as rank 0's is), prints
"loaded", joins the group, profiles a step in step with rank 0 where rank 0's memory plan
does (a GPU with no cache size given), allocates the KV-cache blocks rank 0 broadcasts,
then runs every step rank 0 broadcasts until rank 0 sends None, and exits if rank 0
disappears."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.engine.memory_plan import needs_profile, profile_shape, profile_step
from turboinfer.llm.model.attention import AttentionBatch, KVCache
from turboinfer.llm.model.config import EngineConfig, QuantMode
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.quant import quantize_model
from turboinfer.llm.model.quant_device import quantize_for_device
from turboinfer.llm.parallel.collectives import broadcast_step, init_group
from turboinfer.llm.parallel.group import load_shard, placed


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(1)  # rank 0 is gone: nothing will ever send the next step
        time.sleep(1.0)


@torch.inference_mode()
def _forward(model: LlamaModel, kv_cache: KVCache, items: list[StepItem]) -> None:
    device = kv_cache.k.device
    batch = AttentionBatch.build(starts=[it.start for it in items],
                                 query_lens=[len(it.token_ids) for it in items],
                                 block_tables=[it.block_table for it in items],
                                 block_size=kv_cache.block_size, device=device)
    ids = torch.tensor([t for it in items for t in it.token_ids], dtype=torch.long,
                       device=device)
    model(ids, batch.positions, batch, kv_cache)


def worker_main(rank: int, world: int, port: int, folder: str, config: EngineConfig,
                parent: int) -> None:
    """A worker rank: join, shard, then run every broadcast step until told to stop."""
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    device, _, general = placed(config, rank)
    model = load_shard(Path(folder), config, rank)
    if general:
        quantize_for_device(model, config.quant, group_size=config.quant_group_size)
    elif config.quant is not QuantMode.NONE:
        quantize_model(model, config.quant, group_size=config.quant_group_size)
    print("loaded", flush=True)  # rank 0 waits for this line before the rendezvous
    init_group(rank, world, port, device)
    dist.barrier()
    if needs_profile(device, config):
        profile_step(model, *profile_shape(config))
    blocks = broadcast_step(None)
    if blocks is None:   # rank 0 stopped before its engine was built
        dist.destroy_process_group()
        return
    kv_cache = model.allocate_kv_cache(blocks, config.block_size)
    while (items := broadcast_step(None)) is not None:
        _forward(model, kv_cache, items)
    dist.destroy_process_group()


def main(argv: list[str]) -> int:
    rank, world, port, folder, parent, settings = argv
    data = json.loads(settings)
    data["quant"] = QuantMode(data["quant"])
    data["draft_quant"] = QuantMode(data["draft_quant"])
    worker_main(int(rank), int(world), int(port), folder, EngineConfig(**data), int(parent))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
