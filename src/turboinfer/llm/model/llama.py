"""A Llama-family decoder (Llama, Mistral, Qwen2 layouts) over packed tokens.

Shapes: T is the number of tokens in the step (all sequences packed), H query heads,
KVH key/value heads, D head size. Projections are fused (q/k/v in one matmul, gate/up
in another) because on CPU the number of matmul calls per layer, not their size,
dominates small-batch decode time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from turboinfer.llm.model.attention import AttentionBatch, KVCache, dense_attention, paged_attention
from turboinfer.llm.model.config import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """Precomputed cos/sin tables indexed by absolute position (the HF "rotate half" form)."""

    def __init__(self, head_dim: int, max_positions: int, theta: float) -> None:
        super().__init__()
        # Computed on the CPU whatever the default device (moved with the module): a model
        # built on the meta device to be given its weights still gets real tables.
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64,
                                                device="cpu").float() / head_dim)
        angles = torch.outer(torch.arange(max_positions, device="cpu").float(), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)                 # [P, D]
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.sin_signed: torch.Tensor
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        # sin with its first half negated, for ``rotate``: the sign of rotate-half's
        # negated half moves into the table (exact: negation does not round).
        half = head_dim // 2
        self.register_buffer("sin_signed", torch.cat([-self.sin[:, :half], self.sin[:, half:]],
                                                     dim=-1), persistent=False)

    def tables(self, positions: torch.Tensor, dtype: torch.dtype,
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, signed sin for ``positions`` (for ``rotate``): [T, 1, D], looked up once
        per forward, not per layer."""
        return (self.cos[positions].unsqueeze(1).to(dtype),
                self.sin_signed[positions].unsqueeze(1).to(dtype))


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, D]; rotates pairs (i, i + D/2) by the position's angles."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """``apply_rotary`` with the sign folded into the table (``RotaryEmbedding.tables``):
    one roll instead of two slices, a negation and a concatenation, bit for bit equal."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_signed


def norm(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    return module(x)


def add_norm(x: torch.Tensor, delta: torch.Tensor, module: nn.Module,
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream after adding ``delta``, and its norm by ``module``."""
    x = x + delta
    return x, module(x)


def silu_mul(gate_up: torch.Tensor, intermediate: int) -> torch.Tensor:
    gate, up = gate_up.split(intermediate, dim=-1)
    return F.silu(gate) * up


@dataclass(frozen=True)
class StepOps:
    """A layer's elementwise groups (everything between the matmuls and attention), as
    functions: these eager ones on the general path; fused by torch.compile in a decode
    step captured as a CUDA graph (``backends/torch/fused.py``), where each group is
    one kernel instead of two to four."""

    norm: Callable[[torch.Tensor, nn.Module], torch.Tensor] = norm
    add_norm: Callable[[torch.Tensor, torch.Tensor, nn.Module],
                       tuple[torch.Tensor, torch.Tensor]] = add_norm
    rotate: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = rotate
    silu_mul: Callable[[torch.Tensor, int], torch.Tensor] = silu_mul


EAGER_OPS = StepOps()


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=config.attention_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.scale = self.head_dim ** -0.5

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor],
                batch: AttentionBatch | None, cache: tuple[torch.Tensor, torch.Tensor] | None,
                ops: StepOps = EAGER_OPS) -> torch.Tensor:
        tokens, heads, kv_heads = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x).view(tokens, heads + 2 * kv_heads, self.head_dim)
        # q and k sit side by side in the fused output: one rotation covers both.
        qk = ops.rotate(qkv[:, :heads + kv_heads], *rope)
        q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads:]
        if batch is None or cache is None:
            out = dense_attention(q, k, v, scale=self.scale)
        else:
            out = paged_attention(q, k, v, k_cache=cache[0], v_cache=cache[1], batch=batch,
                                  scale=self.scale)
        return self.o_proj(out.reshape(tokens, self.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * self.intermediate, bias=False)
        self.down_proj = nn.Linear(self.intermediate, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ops: StepOps = EAGER_OPS) -> torch.Tensor:
        return self.down_proj(ops.silu_mul(self.gate_up_proj(x), self.intermediate))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class LlamaModel(nn.Module):
    """Decoder plus LM head. ``forward`` returns hidden states; ``logits`` projects them."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rope = RotaryEmbedding(config.head_dim, config.max_position_embeddings,
                                    config.rope_theta)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                batch: AttentionBatch | None = None, kv_cache: KVCache | None = None,
                ops: StepOps = EAGER_OPS) -> torch.Tensor:
        """input_ids, positions: [T]. Without ``batch``/``kv_cache`` the tokens are one
        sequence attended causally with no cache (perplexity, reference checks)."""
        x = self.embed_tokens(input_ids)                             # [T, hidden]
        rope = self.rope.tables(positions, x.dtype)
        layers: list[DecoderLayer] = list(self.layers)  # type: ignore[arg-type]
        # Each residual add goes with the norm after it: the next layer's input norm,
        # after the last layer the final one.
        norms = [layer.input_layernorm for layer in layers[1:]] + [self.norm]
        h = ops.norm(x, layers[0].input_layernorm)
        for i, (layer, next_norm) in enumerate(zip(layers, norms, strict=True)):
            cache = None if kv_cache is None else (kv_cache.k[i], kv_cache.v[i])
            x, h = ops.add_norm(x, layer.self_attn(h, rope, batch, cache, ops),
                                layer.post_attention_layernorm)
            # Experts route their tokens themselves, on their own ops.
            mlp = layer.mlp(h, ops) if isinstance(layer.mlp, MLP) else layer.mlp(h)
            x, h = ops.add_norm(x, mlp, next_norm)
        return h

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()                          # [N, vocab]

    def allocate_kv_cache(self, num_blocks: int, block_size: int) -> KVCache:
        """The paged cache in the weights' dtype, on their device."""
        c = self.config
        return KVCache.allocate(num_layers=c.num_hidden_layers, num_blocks=num_blocks,
                                block_size=block_size, num_kv_heads=c.num_key_value_heads,
                                head_dim=c.head_dim, dtype=self.embed_tokens.weight.dtype,
                                device=self.embed_tokens.weight.device)
