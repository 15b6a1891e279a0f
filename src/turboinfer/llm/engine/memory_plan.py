"""The engine's memory plan: how many KV-cache blocks, from what.

On the CPU the cache holds what was asked for (``num_blocks``, ``kv_cache_tokens``, or
16384 tokens), as it always has. On CUDA, unless a size was given, the cache takes the
device memory left after the weights and one profiled step's activations, times
``gpu_memory_utilization``: the blocks are allocated once, at load, so a long request
later finds its room or is refused (``LLMEngine.check_request``), never an out-of-memory
error in the middle of a step. The plan is what ``llm bench --json`` reports.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn

from turboinfer.errors import InvalidInputError
from turboinfer.llm.model.config import EngineConfig, ModelConfig
from turboinfer.llm.model.llama import LlamaModel


@dataclass(frozen=True)
class MemoryPlan:
    device: str
    source: str                 # "blocks", "tokens", "cpu default" or "free device memory"
    weights_bytes: int          # the target's (and draft's) parameters and buffers
    kv_bytes: int               # the whole paged cache, target and draft
    kv_bytes_per_block: int
    num_blocks: int
    block_size: int
    max_tokens: int             # tokens the cache holds over all running requests
    free_bytes_after_weights: int | None = None   # CUDA only
    activation_bytes: int = 0   # CUDA only: a profiled step's peak above the weights

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def module_bytes(model: nn.Module) -> int:
    """Bytes of a module's parameters and buffers, each storage counted once (a tied LM
    head shares the embedding's), and of the weights its measured linear kernels hold
    (a layer swapped for its kernels, ``backends/cpu/kernels.py``, keeps them outside
    its parameters: ``held_bytes``)."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        key = tensor.untyped_storage().data_ptr()
        if key in seen:
            continue
        seen.add(key)
        total += tensor.untyped_storage().nbytes()
    held = (getattr(m, "held_bytes", None) for m in model.modules())
    return total + sum(h() for h in held if callable(h))


def kv_block_bytes(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Keys and values of every layer for one block."""
    elem = torch.empty((), dtype=dtype).element_size()
    return (2 * config.num_hidden_layers * block_size * config.num_key_value_heads
            * config.head_dim * elem)


def plan_memory(model: LlamaModel, config: EngineConfig, *, draft: LlamaModel | None = None,
                activation_bytes: int = 0, free_bytes: int | None = None) -> MemoryPlan:
    """The plan for ``model`` (and ``draft``, which shares the block tables) as loaded.
    ``free_bytes``: device memory free after the weights (None on the CPU, or when a size
    was given); ``activation_bytes``: what a step needs beside the cache."""
    models = [model] if draft is None else [model, draft]
    per_block = sum(kv_block_bytes(m.config, config.block_size, m.embed_tokens.weight.dtype)
                    for m in models)
    weights = sum(module_bytes(m) for m in models)
    device = str(model.embed_tokens.weight.device)
    if free_bytes is None:
        source = ("blocks" if config.num_blocks else "tokens" if config.kv_cache_tokens
                  else "cpu default")
        blocks = config.total_blocks
    else:
        source = "free device memory"
        budget = int(free_bytes * config.gpu_memory_utilization) - activation_bytes
        blocks = budget // per_block
        if blocks < 1:
            raise InvalidInputError(
                f"no room for the KV cache on {device}: {free_bytes / 2**30:.2f} GiB free "
                f"after the weights, a step needs {activation_bytes / 2**30:.2f} GiB and "
                f"one block {per_block / 2**20:.2f} MiB")
    return MemoryPlan(device=device, source=source, weights_bytes=weights,
                      kv_bytes=blocks * per_block, kv_bytes_per_block=per_block,
                      num_blocks=blocks, block_size=config.block_size,
                      max_tokens=blocks * config.block_size,
                      free_bytes_after_weights=free_bytes, activation_bytes=activation_bytes)


@torch.inference_mode()
def profile_step(model: LlamaModel, num_tokens: int, num_logits: int) -> int:
    """Peak device memory (bytes, above what was allocated before) of one prompt step of
    ``num_tokens`` tokens without a cache plus ``num_logits`` rows of float logits: what
    a step takes beside the weights and the cache. CUDA only."""
    device = model.embed_tokens.weight.device
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    ids = torch.zeros(num_tokens, dtype=torch.long, device=device)
    hidden = model(ids, torch.arange(num_tokens, device=device))
    logits = model.logits(hidden[:num_logits])
    torch.softmax(logits, dim=-1)  # sampling's probabilities
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - before)


def profile_shape(config: EngineConfig) -> tuple[int, int]:
    """The profiled step: the engine's largest (tokens, logit rows). A parallel group's
    workers run it too, in step with rank 0, since its forward holds the all-reduces."""
    return (config.max_num_batched_tokens,
            min(config.max_num_seqs * (1 + config.num_speculative_tokens),
                config.max_num_batched_tokens))


def needs_profile(device: torch.device, config: EngineConfig) -> bool:
    """Whether the plan profiles a step: on CUDA, when no cache size was given."""
    return device.type == "cuda" and not config.kv_cache_sized


def plan_for_device(model: LlamaModel, config: EngineConfig, *,
                    draft: LlamaModel | None = None) -> MemoryPlan:
    """The plan on the model's device: the CPU rule, or on CUDA (no size given) the free
    memory after the weights less a profiled step of the engine's largest batch."""
    device = model.embed_tokens.weight.device
    if not needs_profile(device, config):
        return plan_memory(model, config, draft=draft)
    activation = profile_step(model, *profile_shape(config))
    if draft is not None:
        activation = max(activation, profile_step(draft, config.max_num_batched_tokens, 1))
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    return plan_memory(model, config, draft=draft, activation_bytes=activation,
                       free_bytes=int(free))
