"""The mixture-of-experts part of a model's shape, read from ``config.json``.

Two Hugging Face layouts: Mixtral (``num_local_experts``, top-k renormalised, every
layer sparse) and Qwen2-MoE (``num_experts``, ``norm_topk_prob``, a shared expert with a
sigmoid gate, and dense layers listed in ``mlp_only_layers`` or skipped by
``decoder_sparse_step``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turboinfer.errors import ConfigError


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    expert_intermediate_size: int
    # Renormalise the top-k routing weights to sum to 1 (Mixtral always does).
    norm_topk_prob: bool
    # 0: no shared expert. Qwen2-MoE adds one to every sparse layer, gated by a sigmoid.
    shared_expert_intermediate_size: int = 0
    sparse_step: int = 1
    dense_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.num_experts < 1 or not 1 <= self.top_k <= self.num_experts:
            raise ConfigError(f"MoE: need 1 <= num_experts_per_tok ({self.top_k}) <= "
                              f"number of experts ({self.num_experts})")
        if self.expert_intermediate_size < 1 or self.sparse_step < 1:
            raise ConfigError("MoE: expert intermediate size and sparse step must be >= 1")

    def is_sparse(self, layer: int) -> bool:
        """Whether ``layer`` has an expert block (else a dense MLP)."""
        return layer not in self.dense_layers and (layer + 1) % self.sparse_step == 0


def moe_from_hf(data: dict[str, Any], architecture: str) -> MoEConfig | None:
    """The MoE settings of a ``config.json`` (None for a dense architecture)."""
    if architecture == "mixtral":
        return MoEConfig(num_experts=int(data["num_local_experts"]),
                         top_k=int(data["num_experts_per_tok"]),
                         expert_intermediate_size=int(data["intermediate_size"]),
                         norm_topk_prob=True)
    if architecture == "qwen2_moe":
        return MoEConfig(num_experts=int(data["num_experts"]),
                         top_k=int(data["num_experts_per_tok"]),
                         expert_intermediate_size=int(data["moe_intermediate_size"]),
                         norm_topk_prob=bool(data.get("norm_topk_prob", False)),
                         shared_expert_intermediate_size=int(
                             data.get("shared_expert_intermediate_size") or 0),
                         sparse_step=int(data.get("decoder_sparse_step") or 1),
                         dense_layers=tuple(int(i) for i in data.get("mlp_only_layers") or ()))
    return None
