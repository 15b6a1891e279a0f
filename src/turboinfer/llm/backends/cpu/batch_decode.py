"""One decode step of several sequences, one token each, on decode.c's native operations.

A 16-row decode step of a small model spends a large share of its time outside the
linear layers when it goes through the model's modules: per layer two norms, the rotary
tables' multiply-adds, the cache write, the gather of every sequence's blocks and a
masked SDPA over the longest table, the activation, residual adds, a dozen module calls,
and per step the batch's positions, slots and additive mask. ``BatchDecoder`` runs the
same layer with the linear layers on the model's own measured kernels (each layer's
``SelectedLinear`` kernel for the step's row count) and the rest on decode.c: one call
each for the norm, the rotation with the cache write, attention that walks each
sequence's block table in place (no gather, no mask) and the activation. The step's
positions, slots, block tables and lengths are one small int64 tensor.

Where every layer's kernel for the step's row count is native, the whole step (every
layer and the final norm) is one call into C (``ti_batch_decode_step``): the same
operations, kernels and order, without about ten calls from Python per layer.

The logits are the general path's up to float rounding (the C attention and norms sum in
another order than torch's), not bit for bit: ``ModelRunner`` keeps the general path
for every step this one does not cover (prompts, mixed steps, speculative verification)
and where the library is absent.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence as Seq

import torch

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.cpu.native import NativeLibrary
from turboinfer.llm.backends.cpu.native_decode import NativeLayer, native_linear
from turboinfer.llm.backends.torch.lean_decode import LayerPlan, Linear, rows_kernel, supports_lean
from turboinfer.llm.model.attention import KVCache
from turboinfer.llm.model.llama import DecoderLayer, LlamaModel

MAX_HEAD_DIM = 512          # decode.c's bound on the rotation's row buffer


def supports_batch_decode(model: LlamaModel, kv_cache: KVCache) -> bool:
    """Dense layers in one process (``supports_lean``), float32 weights and cache (the C
    operations read float32), and head shapes decode.c handles."""
    if not supports_lean(model):
        return False
    c = model.config
    heads, kv_heads, head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    tensors = [model.embed_tokens.weight, model.norm.weight, model.rope.cos,
               model.rope.sin_signed, kv_cache.k, kv_cache.v]
    for module in model.layers:
        layer: DecoderLayer = module  # type: ignore[assignment]
        tensors += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
    return (all(t.dtype == torch.float32 and t.is_contiguous() for t in tensors)
            and heads % kv_heads == 0 and head_dim % 2 == 0 and head_dim <= MAX_HEAD_DIM)


class _Buffers:
    """A step's scratch rows for one batch size, allocated once: the norms' output, the
    attention output, the activation."""

    def __init__(self, rows: int, hidden: int, q_size: int, inner: int) -> None:
        self.h = torch.empty(rows, hidden)
        self.attn = torch.empty(rows, q_size)
        self.act = torch.empty(rows, inner)


class BatchDecoder:
    """Decode steps of several sequences, one new token each, on the paged KV cache."""

    def __init__(self, model: LlamaModel, kv_cache: KVCache, library: NativeLibrary) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.lib = library
        self.block_size = kv_cache.block_size
        self.layers = [LayerPlan.of(m) for m in model.layers]  # type: ignore[arg-type]
        first = self.layers[0]
        self.heads, self.kv_heads, self.head_dim = first.heads, first.kv_heads, first.head_dim
        self.hidden = model.config.hidden_size
        self.inner = model.config.intermediate_size
        self.width = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.embed = model.embed_tokens.weight
        self.final_norm = (model.norm.weight.data_ptr(), float(model.norm.eps))
        self.cos, self.sin = model.rope.cos.data_ptr(), model.rope.sin_signed.data_ptr()
        # Per layer: (norm1, norm2, eps, scale, k cache, v cache) as addresses.
        self.addresses = [(p.norm1.data_ptr(), p.norm2.data_ptr(), float(p.eps),
                           float(p.scale), kv_cache.k[i].data_ptr(), kv_cache.v[i].data_ptr())
                          for i, p in enumerate(self.layers)]
        self._kernels: dict[int, tuple[list[tuple[Linear, Linear, Linear, Linear]], Linear]] = {}
        self._buffers: dict[int, _Buffers] = {}
        # decode.c takes one epsilon and one attention scale for every layer.
        self._uniform = (len({a[2] for a in self.addresses} | {self.final_norm[1]}) == 1
                         and len({a[3] for a in self.addresses}) == 1)
        self._native: dict[int, ctypes.Array[NativeLayer] | None] = {}
        self.native_steps = True        # False: the loop from Python (A/B timing, tests)

    def _native_layers(self, rows: int) -> ctypes.Array[NativeLayer] | None:
        """decode.c's layer structures for a step of ``rows`` rows, where every layer's
        kernel for that row count is native; else None (the loop from Python)."""
        if rows not in self._native:
            found: ctypes.Array[NativeLayer] | None = None
            if self._uniform:
                layers = []
                for (norm1, norm2, _, _, k_p, v_p), kernels in zip(
                        self.addresses, self._kernels_for(rows)[0], strict=True):
                    linears = [native_linear(k) for k in kernels]
                    if any(lin is None for lin in linears):
                        break
                    layers.append(NativeLayer(norm1, norm2, *linears, k_p, v_p))
                else:
                    found = (NativeLayer * len(layers))(*layers)
            self._native[rows] = found
        return self._native[rows]

    def _kernels_for(self, rows: int) -> tuple[list[tuple[Linear, Linear, Linear, Linear]],
                                               Linear]:
        """Each layer's (qkv, o, gate_up, down) kernels and the LM head's, for ``rows``
        rows: what ``SelectedLinear`` would pick per call, looked up once per row count."""
        found = self._kernels.get(rows)
        if found is None:
            found = ([(rows_kernel(p.qkv[1], rows), rows_kernel(p.o[1], rows),
                       rows_kernel(p.gate_up[1], rows), rows_kernel(p.down[1], rows))
                      for p in self.layers], rows_kernel(self.model.lm_head, rows))
            self._kernels[rows] = found
        return found

    def _buffers_for(self, rows: int) -> _Buffers:
        found = self._buffers.get(rows)
        if found is None:
            found = _Buffers(rows, self.hidden, self.heads * self.head_dim, self.inner)
            self._buffers[rows] = found
        return found

    def run(self, items: Seq[StepItem]) -> torch.Tensor:
        """The step backend's entry point, for a step of one new token per item."""
        return self.step([it.token_ids[0] for it in items], [it.start for it in items],
                         [it.block_table for it in items])

    @torch.inference_mode()
    def step(self, tokens: Seq[int], positions: Seq[int],
             block_tables: Seq[list[int]]) -> torch.Tensor:
        """Feed ``tokens[b]`` at ``positions[b]`` of sequence b (everything before it
        cached, its blocks in ``block_tables[b]``); writes their keys and values to the
        cache and returns the next tokens' ``[B, vocab]`` float logits."""
        rows, bs = len(tokens), self.block_size
        # Only the blocks up to each position are read; shorter tables pad with block 0.
        width = max(p // bs for p in positions) + 1
        meta = list(positions)
        meta += [t[p // bs] * bs + p % bs for t, p in zip(block_tables, positions, strict=True)]
        meta += [p + 1 for p in positions]
        for t in block_tables:
            used = t[:width]
            meta += used
            if len(used) < width:
                meta += [0] * (width - len(used))
        # One int64 tensor: positions | slots | lengths | tables [B, width].
        index = torch.tensor(meta, dtype=torch.long)
        base = index.data_ptr()
        pos_p, slot_p, len_p, table_p = base, base + 8 * rows, base + 16 * rows, base + 24 * rows
        x = self.embed.index_select(0, index.new_tensor(tokens))            # [B, hidden]
        kernels, lm_head = self._kernels_for(rows)
        native = self._native_layers(rows) if self.native_steps else None
        if native is not None:
            _, _, eps, scale, _, _ = self.addresses[0]
            if self.lib.batch_decode_step(
                    ctypes.addressof(native), len(native), self.hidden, self.heads,
                    self.kv_heads, self.head_dim, self.inner, eps, scale, self.final_norm[0],
                    self.cos, self.sin, pos_p, slot_p, len_p, table_p, width, bs, rows,
                    x.data_ptr()):
                raise MemoryError("native batch decode step: no memory for its buffers")
            return lm_head(x).float()
        buf = self._buffers_for(rows)
        lib, hidden, heads, kvh, dim = self.lib, self.hidden, self.heads, self.kv_heads, \
            self.head_dim
        h, attn, act = buf.h, buf.attn, buf.act
        x_p, h_p, attn_p, act_p = x.data_ptr(), h.data_ptr(), attn.data_ptr(), act.data_ptr()
        for (norm1, norm2, eps, scale, k_p, v_p), (qkv_k, o_k, gate_up_k, down_k) in zip(
                self.addresses, kernels, strict=True):
            lib.rms_norm(x_p, rows, hidden, norm1, eps, h_p)
            qkv = qkv_k(h).contiguous()
            q_p = qkv.data_ptr()
            lib.rope_kv(q_p, rows, heads, kvh, dim, self.cos, self.sin, pos_p, k_p, v_p, slot_p)
            if lib.paged_decode_attention(q_p, rows, self.width, heads, kvh, dim, k_p, v_p,
                                          table_p, width, bs, len_p, scale, attn_p):
                raise MemoryError("native attention: no memory for the scores")
            x += o_k(attn)                                  # in place: x_p stays valid
            lib.rms_norm(x_p, rows, hidden, norm2, eps, h_p)
            gate_up = gate_up_k(h).contiguous()
            lib.silu_mul(gate_up.data_ptr(), rows, self.inner, act_p)
            x += down_k(act)
        lib.rms_norm(x_p, rows, hidden, self.final_norm[0], self.final_norm[1], h_p)
        return lm_head(h).float()
