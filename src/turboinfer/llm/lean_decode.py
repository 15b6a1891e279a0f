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

``NativeDecoder`` goes further where every layer's one-row kernels are the native ones
(``llm/native``): the whole step, every layer and the final norm, is one C call
(``ti_decode_step`` in ``decode.c``), and only the LM head runs from Python. Its
attention and norms round differently from torch's, so its logits are close to the
general path's, not equal.

``SingleSequenceDecoder`` runs the speculative draft's greedy steps the same lean way,
over keys and values gathered once per proposal into contiguous buffers.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import psutil
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from turboinfer.llm.attention import KVCache
from turboinfer.llm.kernel_candidates import (
    LinearKernel,
    MklPackedKernel,
    NativeF32Kernel,
    NativeInt4Kernel,
    NativeInt8Kernel,
    OneDnnKernel,
    TransposedKernel,
)
from turboinfer.llm.model import MLP, Attention, DecoderLayer, LlamaModel
from turboinfer.llm.native import NativeLibrary, native_status

Linear = Callable[[torch.Tensor], torch.Tensor]
# The native step's own fp32 kernels (for layers whose picks hold none) may take at most
# this share of the memory available when it is built.
OWN_KERNEL_MEMORY_SHARE = 0.25


def one_row(module: nn.Module) -> Linear:
    """The kernel a measured layer (``llm/kernels.py``) runs for one row, else the
    module: a lean step is one row, and the lookup per call is overhead."""
    kernel_for = getattr(module, "kernel_for", None)
    return kernel_for(1) if kernel_for is not None else module


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


class _Linear(ctypes.Structure):
    """decode.c's ``ti_linear``."""

    _fields_ = [("kind", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("kp", ctypes.c_int64), ("w", ctypes.c_void_p), ("scales", ctypes.c_void_p),
                ("bias", ctypes.c_void_p)]


class _Layer(ctypes.Structure):
    """decode.c's ``ti_layer``."""

    _fields_ = [("norm1", ctypes.c_void_p), ("norm2", ctypes.c_void_p), ("qkv", _Linear),
                ("o", _Linear), ("gate_up", _Linear), ("down", _Linear),
                ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p)]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _native_linear(kernel: object) -> _Linear | None:
    """``kernel`` as decode.c's ``ti_linear``; None when it is not a native kernel. The
    padded width comes from the tiles: 4-row tiles of the padded input width."""
    if type(kernel) is NativeInt8Kernel:
        n, k = kernel.out_features, kernel.in_features
        kp = kernel.tiles.numel() // (-(-n // 4) * 4)
        return _Linear(1, n, k, kp, kernel.tiles.data_ptr(), kernel.scales.data_ptr(),
                       _ptr(kernel.bias))
    if type(kernel) is NativeInt4Kernel:
        return _Linear(2, kernel.out_features, kernel.in_features, kernel.in_features,
                       kernel.tiles.data_ptr(), None, _ptr(kernel.bias))
    if type(kernel) is NativeF32Kernel:
        n, k = kernel.out_features, kernel.in_features
        kp = kernel.tiles.numel() // (-(-n // 4) * 4)
        return _Linear(0, n, k, kp, kernel.tiles.data_ptr(), None, _ptr(kernel.bias))
    return None


def _native_tier(which: tuple[Linear, nn.Module]) -> _Linear | None:
    """The layer's one-row kernel if native, else its native kernel for more rows (the
    native layouts serve any row count): fp32's 4096x768 product measured 0.62 ms on
    MKL against 0.72 native at one row, a loss of about 1.2 ms a token over 12 layers
    against the 3-4 ms of per-operation work the one-call step saves
    (benchmarks/llm/lean_decode.py)."""
    kernel = _native_kernel(which)
    return None if kernel is None else _native_linear(kernel)


def _native_kernel(which: tuple[Linear, nn.Module]) -> Linear | None:
    one, module = which
    tiers = [one, getattr(module, "large", None), getattr(module, "prefill", None)]
    return next((k for k in tiers if _native_linear(k) is not None), None)


def _float_weight(which: tuple[Linear, nn.Module]) -> tuple[torch.Tensor,
                                                            torch.Tensor | None] | None:
    """The fp32 weight ``[N, K]`` and bias one of the layer's torch fp32 kernels holds."""
    one, module = which
    for kernel in (one, getattr(module, "large", None), getattr(module, "prefill", None)):
        if isinstance(kernel, (TransposedKernel, MklPackedKernel)):
            return kernel.weight_t.t(), kernel.bias
        if isinstance(kernel, (LinearKernel, OneDnnKernel)):
            return kernel.weight, kernel.bias
    return None


class NativeDecoder:
    """Decode steps of one sequence, one token each, as one call into ``decode.c``.

    Built only where it can run (``build``): the native library compiled, the model and
    its cache in float32, dense layers, and a native kernel for every layer. An fp32
    layer whose measured picks hold none (on a small model the one-row timings of the
    native kernel and MKL are within noise, so the pick varies from load to load) gets
    one built from its weight, up to a quarter of the memory available: which step runs
    must not depend on timing noise. The structures hold the kernels' and cache's
    addresses, so the decoder keeps the model and the cache alive and must be rebuilt if
    either is replaced.
    """

    def __init__(self, model: LlamaModel, kv_cache: KVCache, lib: NativeLibrary,
                 layers: list[_Layer], own: list[NativeF32Kernel]) -> None:
        self.model, self.kv_cache, self.lib = model, kv_cache, lib
        self.own_kernels = own          # kernels the structures point into
        self.block_size = kv_cache.block_size
        self.layers = (_Layer * len(layers))(*layers)
        config = model.config
        first: Attention = model.layers[0].self_attn  # type: ignore[assignment]
        self.dims = (len(layers), config.hidden_size, first.num_heads, first.num_kv_heads,
                     first.head_dim, config.intermediate_size)
        self.eps, self.scale = float(model.norm.eps), float(first.scale)
        self.final_norm = model.norm.weight.detach()
        self.cos, self.sin = model.rope.cos, model.rope.sin_signed
        self.embed = model.embed_tokens.weight.detach()
        self.lm_head = one_row(model.lm_head)
        # For greedy steps without Python between them (a draft's proposal): the LM head's
        # native kernel, when it has one.
        self.native_head = _native_tier((self.lm_head, model.lm_head))
        # A verification's few rows: the native kernel serves any row count, where the
        # LM head's pick for few rows is its one-row winner (2048x256 at 4 rows on the
        # demo model: 0.26 ms on MKL's one-row choice, 0.05-0.1 native).
        self.head_rows = _native_kernel((self.lm_head, model.lm_head)) or model.lm_head
        if not self.embed.is_contiguous():
            self.native_head = None

    @classmethod
    def build(cls, model: LlamaModel, kv_cache: KVCache) -> NativeDecoder | None:
        lib = native_status().library
        if (lib is None or not supports_lean(model)
                or model.embed_tokens.weight.dtype != torch.float32
                or kv_cache.k.dtype != torch.float32
                or any(not t.is_contiguous() for t in (kv_cache.k, kv_cache.v, model.rope.cos,
                                                      model.rope.sin_signed))):
            return None
        eps = {float(model.norm.eps)}
        layers, own = [], []
        budget = OWN_KERNEL_MEMORY_SHARE * psutil.virtual_memory().available
        for i, module in enumerate(model.layers):
            layer: DecoderLayer = module  # type: ignore[assignment]
            plan = LayerPlan.of(layer)
            eps.add(plan.eps)
            linears = []
            for which in (plan.qkv, plan.o, plan.gate_up, plan.down):
                lin = _native_tier(which)
                found = _float_weight(which) if lin is None else None
                if found is not None and found[0].numel() * 4 <= budget:
                    own.append(NativeF32Kernel(lib, *found))
                    budget -= found[0].numel() * 4
                    lin = _native_linear(own[-1])
                if lin is None:
                    return None
                linears.append(lin)
            layers.append(_Layer(plan.norm1.data_ptr(), plan.norm2.data_ptr(), *linears,
                                 kv_cache.k[i].data_ptr(), kv_cache.v[i].data_ptr()))
        if len(eps) != 1:
            return None         # decode.c takes one epsilon for every norm
        return cls(model, kv_cache, lib, layers, own)

    @torch.inference_mode()
    def step(self, token: int, position: int, block_table: list[int]) -> torch.Tensor:
        """As ``LeanDecoder.step``: feed ``token`` at ``position``, write its keys and
        values to the cache, return the next token's ``[1, vocab]`` float logits."""
        return self.forward([token], position, block_table, 1)

    @torch.inference_mode()
    def forward(self, tokens: list[int], start: int, block_table: list[int],
                num_logits: int) -> torch.Tensor:
        """Feed ``tokens`` at positions ``start...`` (everything before them cached; a few
        rows: the attention is one query row at a time); returns the last
        ``num_logits`` rows' ``[num_logits, vocab]`` float logits."""
        rows = len(tokens)
        used = (start + rows - 1) // self.block_size + 1
        if len(block_table) < used:     # the C step would read past the table
            raise ValueError(f"block table of {len(block_table)} blocks has no block for "
                             f"position {start + rows - 1}")
        x = (self.embed[tokens[0]].clone() if rows == 1
             else self.embed.index_select(0, torch.tensor(tokens, dtype=torch.long)))
        table = torch.tensor(block_table[:used], dtype=torch.long)
        rc = self.lib.decode_step(ctypes.addressof(self.layers), *self.dims, self.eps,
                                  self.scale, self.final_norm.data_ptr(), self.cos.data_ptr(),
                                  self.sin.data_ptr(), table.data_ptr(), self.block_size,
                                  start, rows, x.data_ptr())
        if rc:
            raise MemoryError("native decode step: no memory for its buffers")
        if num_logits == 0:
            return x.new_zeros(0, self.model.config.vocab_size)
        last = x.view(rows, -1)[rows - num_logits:]
        # The one-row kernel may be packed for one row: more rows take another.
        return (self.lm_head(last) if num_logits == 1 else self.head_rows(last)).float()


    def can_run_greedy(self) -> bool:
        return self.native_head is not None

    def greedy(self, feed: list[int], start: int, block_table: list[int],
               steps: int) -> list[int]:
        """As ``SingleSequenceDecoder.greedy``, LM head and argmax included, in one call
        (``can_run_greedy``: the LM head has a native kernel)."""
        assert self.native_head is not None
        used = (start + len(feed) + steps - 2) // self.block_size + 1
        if len(block_table) < used or not feed or steps < 1:
            raise ValueError(f"greedy steps need a feed, a step and a block for position "
                             f"{start + len(feed) + steps - 2}")
        table = torch.tensor(block_table[:used], dtype=torch.long)
        tokens = torch.tensor(feed, dtype=torch.long)
        out = torch.empty(steps, dtype=torch.long)
        rc = self.lib.greedy_steps(ctypes.addressof(self.layers), *self.dims, self.eps,
                                   self.scale, self.final_norm.data_ptr(), self.cos.data_ptr(),
                                   self.sin.data_ptr(), table.data_ptr(), self.block_size,
                                   self.embed.data_ptr(), ctypes.addressof(self.native_head),
                                   tokens.data_ptr(), len(feed), start, steps, out.data_ptr())
        if rc:
            raise MemoryError("native greedy steps: no memory for their buffers")
        return out.tolist()


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
