"""Mixture-of-experts blocks (Mixtral, Qwen2-MoE) for the Llama-family decoder.

A block routes each token to its top-k experts, then runs the experts grouped: the
step's (token, expert) pairs are sorted by expert, and each active expert runs one
gate/up and one down matmul over all of its tokens (``index_select`` in, ``index_add_``
out). The Python loop is over experts, never over tokens, so a decode step of B
sequences costs at most ``num_experts`` expert calls however large B is.

Where the expert weights live is the ``ExpertSet``'s business: ``ResidentExperts``
keeps them as ordinary modules (so quantization and the fp32 kernels apply per expert);
``llm/model/experts.py`` keeps a bounded cache over the safetensors file instead; under expert
parallelism a rank holds only its own experts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from turboinfer.llm.model.config import ModelConfig
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.moe_config import MoEConfig


class ExpertMLP(nn.Module):
    """One SwiGLU expert (also the shared expert), gate and up fused into one matmul."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.intermediate = intermediate_size
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Gate(nn.Module):
    """A bias-free projection kept in float. Deliberately not an ``nn.Linear``: weight
    quantization and the packed fp32 kernels replace every ``nn.Linear``, and a
    quantized router could send tokens to different experts."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(out_features, in_features), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class ExpertSet(Protocol):
    """Where a layer's experts come from."""

    def holds(self, expert: int) -> bool:
        """Whether this process computes ``expert`` (all of them, except under expert
        parallelism)."""
        ...

    def fetch(self, experts: list[int]) -> dict[int, nn.Module]:
        """The modules for ``experts`` (all held), loading any that are not resident."""
        ...


class ResidentExperts(nn.ModuleDict):
    """Experts held in memory as modules, keyed by expert index (state-dict names
    ``experts.<e>.gate_up_proj.weight`` as in the Hugging Face layout, once fused)."""

    def __init__(self, hidden_size: int, intermediate_size: int, ids: Iterable[int]) -> None:
        super().__init__({str(e): ExpertMLP(hidden_size, intermediate_size) for e in ids})

    def holds(self, expert: int) -> bool:
        return str(expert) in self

    def fetch(self, experts: list[int]) -> dict[int, nn.Module]:
        return {e: self[str(e)] for e in experts}


def route(logits: torch.Tensor, top_k: int, normalize: bool,
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts in float32, keep the top k: (weights [T, k], ids [T, k])."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


class SparseMoeBlock(nn.Module):
    """Routed experts plus, for Qwen2-MoE, a shared expert scaled by a sigmoid gate."""

    def __init__(self, config: ModelConfig, layer: int, experts: ExpertSet | None = None,
                 ) -> None:
        super().__init__()
        moe = config.moe
        assert moe is not None
        self.layer = layer
        self.num_experts = moe.num_experts
        self.top_k = moe.top_k
        self.normalize = moe.norm_topk_prob
        self.gate = Gate(config.hidden_size, moe.num_experts)
        self.experts: ExpertSet = experts if experts is not None else ResidentExperts(
            config.hidden_size, moe.expert_intermediate_size, range(moe.num_experts))
        self.shared_expert: ExpertMLP | None = None
        self.shared_expert_gate: Gate | None = None
        if moe.shared_expert_intermediate_size:
            self.shared_expert = ExpertMLP(config.hidden_size,
                                           moe.shared_expert_intermediate_size)
            self.shared_expert_gate = Gate(config.hidden_size, 1)
        # Expert parallelism replicates the shared expert; only one rank adds it.
        self.add_shared = True
        # Tokens routed to each expert since the last reset (the load balance metric).
        self.tokens_per_expert = torch.zeros(moe.num_experts, dtype=torch.long)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.top_k, self.normalize)
        out = self._experts(x, weights, ids)
        if self.shared_expert is not None and self.shared_expert_gate is not None \
                and self.add_shared:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out

    def _experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                 ) -> torch.Tensor:
        flat = ids.reshape(-1)                                    # [T*k]
        order = torch.argsort(flat, stable=True)
        counts_t = torch.bincount(flat, minlength=self.num_experts)
        self.tokens_per_expert += counts_t
        counts = counts_t.tolist()
        token_of = order // self.top_k                            # token of each sorted pair
        sorted_weights = weights.reshape(-1)[order].to(x.dtype).unsqueeze(1)
        active = [e for e, c in enumerate(counts) if c and self.experts.holds(e)]
        modules = self.experts.fetch(active)
        out = torch.zeros_like(x)
        start = 0
        for expert, count in enumerate(counts):
            end = start + count
            if count and expert in modules:
                rows = token_of[start:end]
                y = modules[expert](x.index_select(0, rows)) * sorted_weights[start:end]
                out.index_add_(0, rows, y)
            start = end
        return out


def moe_blocks(model: nn.Module) -> list[SparseMoeBlock]:
    """The model's expert blocks, in layer order (wrappers included)."""
    return [m for m in model.modules() if isinstance(m, SparseMoeBlock)]


def build_model(config: ModelConfig,
                experts_for: dict[int, ExpertSet] | None = None) -> LlamaModel:
    """The decoder for ``config``: a ``LlamaModel`` whose sparse layers' MLPs are expert
    blocks. ``experts_for[layer]`` replaces the resident experts of that layer."""
    model = LlamaModel(config)
    moe: MoEConfig | None = config.moe
    if moe is None:
        return model
    for i, layer in enumerate(model.layers):
        if moe.is_sparse(i):
            layer.mlp = SparseMoeBlock(config, i, (experts_for or {}).get(i))
    return model
