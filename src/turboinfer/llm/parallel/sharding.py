"""Split a loaded model's weights for one rank.

Tensor parallelism (``tp`` ranks) is Megatron-style: q/k/v and gate/up projections are
column-parallel (each rank holds its share of heads and channels, and of the KV cache's
heads), o_proj and down_proj row-parallel, each followed by one all-reduce; norms,
embeddings, routers and the LM head are replicated. Expert parallelism (``ep`` ranks)
gives rank r the experts e with e % ep == r whole; every rank routes all tokens (they
are replicated after attention), runs its own experts, and the block's all-reduce
combines them. A shared expert is split by channels under TP, else computed by rank 0.
"""

from __future__ import annotations

import dataclasses
from typing import cast

import torch

from turboinfer.errors import ConfigError
from turboinfer.llm.model.config import ModelConfig
from turboinfer.llm.model.llama import DecoderLayer, LlamaModel
from turboinfer.llm.model.moe import ResidentExperts, SparseMoeBlock, build_model
from turboinfer.llm.parallel.collectives import AllReduce


def check_layout(config: ModelConfig, tp: int, ep: int) -> None:
    """Refuse a split the model's shape does not divide into."""
    if tp > 1 and ep > 1 and tp != ep:
        raise ConfigError(f"tensor parallel {tp} and expert parallel {ep} must be equal "
                          "when both are used (one group of ranks)")
    moe = config.moe
    if ep > 1 and moe is None:
        raise ConfigError("expert parallelism needs a mixture-of-experts model")
    if ep > 1 and moe is not None and moe.num_experts < ep:
        raise ConfigError(f"{moe.num_experts} experts cannot be split over {ep} ranks")
    if tp == 1:
        return
    sizes = {"num_attention_heads": config.num_attention_heads,
             "num_key_value_heads": config.num_key_value_heads,
             "intermediate_size": config.intermediate_size}
    if moe is not None:
        sizes["shared_expert_intermediate_size"] = moe.shared_expert_intermediate_size
        if ep == 1:
            sizes["moe_intermediate_size"] = moe.expert_intermediate_size
    for name, size in sizes.items():
        if size % tp:
            raise ConfigError(f"tensor parallel {tp} does not divide {name} ({size})")


def local_config(config: ModelConfig, tp: int, ep: int) -> ModelConfig:
    """The shape one rank holds: 1/tp of the heads and channels."""
    if tp == 1:
        return config
    moe = config.moe
    if moe is not None:
        moe = dataclasses.replace(
            moe, shared_expert_intermediate_size=moe.shared_expert_intermediate_size // tp,
            expert_intermediate_size=(moe.expert_intermediate_size if ep > 1
                                      else moe.expert_intermediate_size // tp))
    return dataclasses.replace(config, num_attention_heads=config.num_attention_heads // tp,
                               num_key_value_heads=config.num_key_value_heads // tp,
                               intermediate_size=config.intermediate_size // tp, moe=moe)


def _rows(t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    return t.chunk(tp, dim=0)[rank]


def _split_value(name: str, value: torch.Tensor, config: ModelConfig, rank: int,
                 tp: int, ep: int) -> torch.Tensor | None:
    """This rank's part of one fused weight (None: another rank's expert)."""
    parts = name.split(".")
    if ep > 1 and ".mlp.experts." in name:
        return value if int(parts[4]) % ep == rank else None
    if tp == 1:
        return value
    if name.endswith(("self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias")):
        q = config.num_attention_heads * config.head_dim
        kv = config.num_key_value_heads * config.head_dim
        return torch.cat([_rows(p, rank, tp) for p in value.split([q, kv, kv])])
    if name.endswith("gate_up_proj.weight"):
        return torch.cat([_rows(p, rank, tp) for p in value.chunk(2)])
    if name.endswith(("self_attn.o_proj.weight", "down_proj.weight")):
        return value.chunk(tp, dim=1)[rank]
    return value


def shard_model(full: LlamaModel, rank: int, tp: int, ep: int) -> LlamaModel:
    """Rank ``rank``'s model: its slices of ``full``'s weights, all-reduces in place."""
    config = full.config
    check_layout(config, tp, ep)
    model = build_model(local_config(config, tp, ep))
    blocks = [b for b in model.modules() if isinstance(b, SparseMoeBlock)]
    if ep > 1:
        moe = config.moe
        assert moe is not None
        mine = [e for e in range(moe.num_experts) if e % ep == rank]
        for block in blocks:
            block.experts = ResidentExperts(config.hidden_size, moe.expert_intermediate_size,
                                            mine)
            # Replicated under expert parallelism alone: only rank 0 adds it.
            block.add_shared = tp > 1 or rank == 0
    state = {}
    for name, value in full.state_dict().items():
        part = _split_value(name, value, config, rank, tp, ep)
        if part is not None:
            state[name] = part.clone()
    model.load_state_dict(state, strict=True)
    model.to(full.embed_tokens.weight.dtype)
    model.eval()
    model.requires_grad_(False)
    for layer in cast(list[DecoderLayer], list(model.layers)):
        sparse = isinstance(layer.mlp, SparseMoeBlock)
        if tp > 1:
            layer.self_attn.o_proj = AllReduce(  # type: ignore[assignment]
                layer.self_attn.o_proj)
        if tp > 1 or (ep > 1 and sparse):
            layer.mlp = AllReduce(layer.mlp)  # type: ignore[assignment]
    return model
