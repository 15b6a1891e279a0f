"""One decode step of one sequence, without the packed-batch machinery.

At batch 1 a decode step of a small model spends a large share of its time outside the
linear layers: module calls, the step's positions, slots and mask, the per-layer lookup
of each layer's kernel. A lone sequence needs none of that. ``LeanDecoder`` resolves
each layer's one-row kernels, norms and rope tables once and then runs the same
operations the model's modules run, in the same order, so its logits and the keys and
values it writes to the paged cache are the general path's bit for bit: attention gets
that path's inputs too (a view of the cache where the sequence's blocks are consecutive,
else the gathered blocks and an additive mask), since a mask cut short rounds
differently, and through int4's bf16 activations that moved logits by 0.06.

``llm/backends/cpu/native_decode.py`` goes further where every layer has a native kernel: the whole
step is one call into C.

``SingleSequenceDecoder`` runs the speculative draft's greedy steps the same lean way,
over keys and values gathered once per proposal into contiguous buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.model.attention import KVCache
from turboinfer.llm.model.llama import MLP, Attention, DecoderLayer, LlamaModel

Linear = Callable[[torch.Tensor], torch.Tensor]


def rows_kernel(module: nn.Module, rows: int) -> Linear:
    """The kernel a measured layer (``backends/cpu/kernels.py``) runs for ``rows`` rows, else the
    module: the lookup per call is overhead a step with a known row count can skip."""
    kernel_for = getattr(module, "kernel_for", None)
    return kernel_for(rows) if kernel_for is not None else module


def one_row(module: nn.Module) -> Linear:
    """``rows_kernel`` for a lean step's one row."""
    return rows_kernel(module, 1)


@dataclass(frozen=True)
class LayerPlan:
    """One decoder layer's weights and kernels, looked up once."""

    norm1: torch.Tensor
    norm2: torch.Tensor
    eps: float
    qkv: tuple[Linear, nn.Module]     # (one-row kernel, the module for more rows)
    o: tuple[Linear, nn.Module]
    gate_up: tuple[Linear, nn.Module]
    down: tuple[Linear, nn.Module]
    heads: int
    kv_heads: int
    head_dim: int
    scale: float

    @classmethod
    def of(cls, layer: DecoderLayer) -> LayerPlan:
        attn, mlp = layer.self_attn, layer.mlp

        def pair(m: nn.Module) -> tuple[Linear, nn.Module]:
            return one_row(m), m

        return cls(layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                   layer.input_layernorm.eps, pair(attn.qkv_proj), pair(attn.o_proj),
                   pair(mlp.gate_up_proj), pair(mlp.down_proj), attn.num_heads,
                   attn.num_kv_heads, attn.head_dim, attn.scale)

    @staticmethod
    def linear(which: tuple[Linear, nn.Module], x: torch.Tensor) -> torch.Tensor:
        return which[0](x) if x.shape[0] == 1 else which[1](x)


def supports_lean(model: LlamaModel) -> bool:
    """Dense layers in one process: mixture-of-experts blocks route tokens through their
    own modules, and a sharded model's workers expect the general path's collectives."""
    if dist.is_available() and dist.is_initialized():
        return False
    return all(isinstance(layer.self_attn, Attention) and type(layer.mlp) is MLP
               for layer in model.layers)


class LeanDecoder:
    """Decode steps of one sequence, one token each, on the model's paged KV cache."""

    def __init__(self, model: LlamaModel, kv_cache: KVCache) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.layers = [LayerPlan.of(m) for m in model.layers]  # type: ignore[arg-type]
        self.final_norm = (model.norm.weight, model.norm.eps)
        self.lm_head = one_row(model.lm_head)
        dtype = model.embed_tokens.weight.dtype
        # The tables the model's forward looks up, in its dtype ([P, 1, D]).
        self.cos = model.rope.cos.to(dtype)[:, None]
        self.sin = model.rope.sin_signed.to(dtype)[:, None]
        kv_heads, head_dim = kv_cache.k.shape[-2:]
        self.flat = [(kv_cache.k[i].view(-1, kv_heads, head_dim),
                      kv_cache.v[i].view(-1, kv_heads, head_dim))
                     for i in range(kv_cache.k.shape[0])]

    def run(self, items: Seq[StepItem]) -> torch.Tensor:
        """The step backend's entry point, for a step of one item of one new token."""
        it = items[0]
        return self.step(it.token_ids[0], it.start, it.block_table)

    @torch.inference_mode()
    def step(self, token: int, position: int, block_table: list[int]) -> torch.Tensor:
        """Feed ``token`` at ``position`` (everything before it cached); writes its keys
        and values to the cache and returns the next token's ``[1, vocab]`` float logits."""
        bs = self.block_size
        used = block_table[:position // bs + 1]
        count = position + 1
        slot = used[-1] * bs + position % bs
        # Consecutive blocks: the keys are one view of the cache, as in the general path's
        # single-sequence span. Otherwise the general path's gather of the whole table
        # and its additive mask, built once per step (the same SDPA inputs, so the same
        # rounding).
        first = used[0] * bs if used == list(range(used[0], used[0] + len(used))) else None
        table = mask = None
        if first is None:
            table = torch.tensor(block_table, dtype=torch.long)
            dtype = self.cos.dtype
            mask = torch.zeros(1, 1, 1, len(block_table) * bs, dtype=dtype)
            mask[..., count:] = float("-inf")
        cos, sin = self.cos.narrow(0, position, 1), self.sin.narrow(0, position, 1)
        x = self.model.embed_tokens.weight.narrow(0, token, 1)
        hidden = x.shape[-1]
        cache = self.kv_cache
        for i, (plan, (flat_k, flat_v)) in enumerate(zip(self.layers, self.flat, strict=True)):
            heads, kvh, size = plan.heads, plan.kv_heads, plan.head_dim
            h = F.rms_norm(x, (hidden,), plan.norm1, plan.eps)
            qkv = plan.qkv[0](h).view(1, heads + 2 * kvh, size)
            qk = qkv.narrow(1, 0, heads + kvh)
            qk = qk * cos + qk.roll(size // 2, -1) * sin
            flat_k.narrow(0, slot, 1).copy_(qk.narrow(1, heads, kvh))
            flat_v.narrow(0, slot, 1).copy_(qkv.narrow(1, heads + kvh, kvh))
            if first is not None:
                keys, values = flat_k.narrow(0, first, count), flat_v.narrow(0, first, count)
            else:
                assert table is not None
                keys = cache.k[i].index_select(0, table).view(-1, kvh, size)
                values = cache.v[i].index_select(0, table).view(-1, kvh, size)
            o = F.scaled_dot_product_attention(
                qk.narrow(1, 0, heads).view(1, 1, heads, size).transpose(1, 2),
                keys.unsqueeze(0).transpose(1, 2), values.unsqueeze(0).transpose(1, 2),
                attn_mask=mask, scale=plan.scale, enable_gqa=kvh != heads)  # [1, H, 1, D]
            x = x + plan.o[0](o.reshape(1, heads * size))
            gate_up = plan.gate_up[0](F.rms_norm(x, (hidden,), plan.norm2, plan.eps))
            inner = gate_up.shape[-1] // 2
            x = x + plan.down[0](F.silu(gate_up.narrow(1, 0, inner))
                                 * gate_up.narrow(1, inner, inner))
        return self.lm_head(F.rms_norm(x, (hidden,), *self.final_norm)).float()


class SingleSequenceDecoder:
    """Greedy steps of one sequence, without the packed-batch machinery.

    A draft step is almost all per-operation overhead (one layer, a handful of rows), and
    the runner's general path pays for generality a lone sequence does not need: it
    builds the batch's positions, slots and additive mask and gathers every block of the
    cache again in every layer of every step. Here a proposal gathers the sequence's
    cached keys and values once into contiguous buffers, and each step appends its own
    (to the buffers and the paged cache, so the next proposal finds them) and attends
    over the buffer's prefix, with no mask for a single new token. It runs the model's
    own modules, so its tokens are the model's greedy tokens up to float rounding; a draft
    only proposes and the target verifies every token, so rounding could cost acceptance,
    never exactness.
    """

    def __init__(self, model: LlamaModel, kv_cache: KVCache) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        # Resolved once: per step, every module call and tensor slice is overhead.
        self.layers = [LayerPlan.of(module) for module in model.layers]  # type: ignore[arg-type]
        self.final_norm = (model.norm.weight, model.norm.eps)
        self.lm_head = one_row(model.lm_head)
        # Rotate-half's sign folded into the sin table: one roll per rotation.
        self.cos = model.rope.cos[:, None]
        self.sin = model.rope.sin_signed[:, None]

    @torch.inference_mode()
    def greedy(self, feed: list[int], position: int, block_table: list[int],
               steps: int) -> list[int]:
        """Feed ``feed`` (the tokens not yet in the cache) at ``position``, then each
        argmax in turn; returns the ``steps`` argmax tokens (the first comes from the
        feed's last position)."""
        bs = self.block_size
        end = position + len(feed) + steps - 1          # positions [position, end) written
        table = torch.tensor(block_table[:(end - 1) // bs + 1], dtype=torch.long)
        cache = self.kv_cache
        kv_heads, head_dim = cache.k.shape[-2:]
        # Per layer: the sequence's keys and values by position (a copy), and the paged
        # cache's slots (where the next proposal's gather will look).
        buffers = [(cache.k[i].index_select(0, table).view(-1, kv_heads, head_dim),
                    cache.v[i].index_select(0, table).view(-1, kv_heads, head_dim),
                    cache.k[i].view(-1, kv_heads, head_dim),
                    cache.v[i].view(-1, kv_heads, head_dim))
                   for i in range(cache.k.shape[0])]
        slots = torch.tensor([block_table[p // bs] * bs + p % bs for p in range(position, end)],
                             dtype=torch.long)
        out: list[int] = []
        tokens, pos = feed, position
        while len(out) < steps:
            n = len(tokens)
            logits = self._forward(tokens, pos, slots.narrow(0, pos - position, n), buffers)
            out.append(int(logits.argmax()))
            pos += n
            tokens = out[-1:]
        return out

    def _forward(self, tokens: list[int], pos: int, slots: torch.Tensor,
                 buffers: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]],
                 ) -> torch.Tensor:
        """Logits of the last of ``tokens`` fed at positions ``pos...``."""
        model = self.model
        n, end = len(tokens), pos + len(tokens)
        weight = model.embed_tokens.weight
        x = (weight.narrow(0, tokens[0], 1) if n == 1
             else weight.index_select(0, torch.tensor(tokens, dtype=torch.long)))
        cos, sin = self.cos.narrow(0, pos, n), self.sin.narrow(0, pos, n)
        mask = None
        if n > 1:
            # New token j sees every cached position and the new ones up to itself.
            mask = torch.zeros(n, end)
            mask[:, pos:].masked_fill_(torch.ones(n, n, dtype=torch.bool).triu(1),
                                       float("-inf"))
        hidden = x.shape[-1]
        for plan, (keys, values, flat_k, flat_v) in zip(self.layers, buffers, strict=True):
            heads, kvh, size = plan.heads, plan.kv_heads, plan.head_dim
            h = F.rms_norm(x, (hidden,), plan.norm1, plan.eps)
            qkv = plan.linear(plan.qkv, h).view(n, heads + 2 * kvh, size)
            qk = qkv.narrow(1, 0, heads + kvh)
            qk = qk * cos + qk.roll(size // 2, -1) * sin
            k, v = qk.narrow(1, heads, kvh), qkv.narrow(1, heads + kvh, kvh)
            keys.narrow(0, pos, n).copy_(k)
            values.narrow(0, pos, n).copy_(v)
            flat_k.index_copy_(0, slots, k)
            flat_v.index_copy_(0, slots, v)
            o = F.scaled_dot_product_attention(
                qk.narrow(1, 0, heads).transpose(0, 1), keys.narrow(0, 0, end).transpose(0, 1),
                values.narrow(0, 0, end).transpose(0, 1), attn_mask=mask, scale=plan.scale,
                enable_gqa=kvh != heads)                                   # [H, n, D]
            x = x + plan.linear(plan.o, o.transpose(0, 1).reshape(n, heads * size))
            gate_up = plan.linear(plan.gate_up, F.rms_norm(x, (hidden,), plan.norm2, plan.eps))
            inner = gate_up.shape[-1] // 2
            x = x + plan.linear(plan.down, F.silu(gate_up.narrow(1, 0, inner))
                                * gate_up.narrow(1, inner, inner))
        last = F.rms_norm(x.narrow(0, n - 1, 1), (hidden,), *self.final_norm)
        return self.lm_head(last)[0]
