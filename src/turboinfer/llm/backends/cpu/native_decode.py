"""A lone sequence's step as one call into C, where every layer has a native kernel.

``NativeDecoder`` hands a step of a few new tokens of one sequence (a decode step, a
speculative verification, a draft's catch-up) to ``ti_decode_step`` in
``native/decode.c``: every layer (norms, the native linear kernels, rotary embedding
and cache write, single-query attention over the block table, silu, residual adds) and
the final norm, with the LM head from Python; and a greedy draft proposal, argmax
included, to ``ti_greedy_steps``. C attention and norms round differently from torch's,
so its logits are close to the lean and packed paths', not equal.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence as Seq

import psutil
import torch
from torch import nn

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.cpu.kernel_candidates import (
    LinearKernel,
    MklPackedKernel,
    NativeAmxInt8Kernel,
    NativeF32Kernel,
    NativeHalfKernel,
    NativeInt4Kernel,
    NativeInt8Kernel,
    NativeQ8Kernel,
    OneDnnKernel,
    TransposedKernel,
    half_storage,
)
from turboinfer.llm.backends.cpu.native import NativeLibrary, native_status
from turboinfer.llm.backends.cpu.prefetch import F32Linear, PrefetchChoice, choose_f32_prefetch
from turboinfer.llm.backends.torch.lean_decode import LayerPlan, Linear, one_row, supports_lean
from turboinfer.llm.model.attention import KVCache
from turboinfer.llm.model.llama import Attention, DecoderLayer, LlamaModel

# The native step's own fp32 kernels (for layers whose picks hold none) may take at most
# this share of the memory available when it is built.
OWN_KERNEL_MEMORY_SHARE = 0.25


class NativeLinear(ctypes.Structure):
    """decode.c's ``ti_linear``."""

    _fields_ = [("kind", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("kp", ctypes.c_int64), ("w", ctypes.c_void_p), ("scales", ctypes.c_void_p),
                ("bias", ctypes.c_void_p)]


class NativeLayer(ctypes.Structure):
    """decode.c's ``ti_layer``."""

    _fields_ = [("norm1", ctypes.c_void_p), ("norm2", ctypes.c_void_p), ("qkv", NativeLinear),
                ("o", NativeLinear), ("gate_up", NativeLinear), ("down", NativeLinear),
                ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p)]


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def native_linear(kernel: object) -> NativeLinear | None:
    """``kernel`` as decode.c's ``ti_linear``; None when it is not a native kernel. The
    padded width comes from the tiles: 4-row tiles of the padded input width."""
    if type(kernel) is NativeInt8Kernel:
        n, k = kernel.out_features, kernel.in_features
        kp = kernel.tiles.numel() // (-(-n // 4) * 4)
        return NativeLinear(1, n, k, kp, kernel.tiles.data_ptr(), kernel.scales.data_ptr(),
                       _ptr(kernel.bias))
    if type(kernel) is NativeAmxInt8Kernel:
        return NativeLinear(3, kernel.out_features, kernel.in_features, kernel.padded,
                       kernel.tiles.data_ptr(), kernel.scales.data_ptr(), _ptr(kernel.bias))
    if type(kernel) is NativeInt4Kernel:
        return NativeLinear(2, kernel.out_features, kernel.in_features, kernel.in_features,
                       kernel.tiles.data_ptr(), None, _ptr(kernel.bias))
    if type(kernel) is NativeQ8Kernel:
        return NativeLinear(4, kernel.out_features, kernel.in_features, kernel.in_features,
                       kernel.tiles.data_ptr(), None, _ptr(kernel.bias))
    if type(kernel) is NativeF32Kernel or type(kernel) is NativeHalfKernel:
        n, k = kernel.out_features, kernel.in_features
        kp = kernel.tiles.numel() // (-(-n // 4) * 4)
        kind = HALF_KINDS[kernel.dtype] if isinstance(kernel, NativeHalfKernel) else 0
        return NativeLinear(kind, n, k, kp, kernel.tiles.data_ptr(), None, _ptr(kernel.bias))
    return None


# decode.c's kinds of the fp32 arithmetic on 16-bit weights.
HALF_KINDS = {torch.float16: 5, torch.bfloat16: 6}


def _native_tier(which: tuple[Linear, nn.Module]) -> NativeLinear | None:
    """The layer's one-row kernel if native, else its native kernel for more rows (the
    native layouts serve any row count): fp32's 4096x768 product measured 0.62 ms on
    MKL against 0.72 native at one row, a loss of about 1.2 ms a token over 12 layers
    against the 3-4 ms of per-operation work the one-call step saves
    (benchmarks/llm/lean_decode.py)."""
    kernel = _native_kernel(which)
    return None if kernel is None else native_linear(kernel)


def _native_kernel(which: tuple[Linear, nn.Module]) -> Linear | None:
    one, module = which
    tiers = [one, getattr(module, "large", None), getattr(module, "prefill", None)]
    return next((k for k in tiers if native_linear(k) is not None), None)


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


def _own_kernel(lib: NativeLibrary, weight: torch.Tensor, bias: torch.Tensor | None,
                budget: float) -> NativeF32Kernel | NativeHalfKernel | None:
    """A native kernel for an fp32 layer whose picks hold none: in 16 bits where the
    weight is exactly fp16 or bf16 (the same results), within ``budget`` bytes."""
    half = half_storage(weight)
    if weight.numel() * (4 if half is None else 2) > budget:
        return None
    return NativeF32Kernel(lib, weight, bias) if half is None else NativeHalfKernel(
        lib, weight, bias, half)


class NativeDecoder:
    """Steps of one sequence, a few new tokens each, as one call into ``decode.c``.

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
                 layers: list[NativeLayer],
                 own: list[NativeF32Kernel | NativeHalfKernel]) -> None:
        self.model, self.kv_cache, self.lib = model, kv_cache, lib
        self.own_kernels = own          # kernels the structures point into
        self.block_size = kv_cache.block_size
        self.layers = (NativeLayer * len(layers))(*layers)
        config = model.config
        first: Attention = model.layers[0].self_attn  # type: ignore[assignment]
        self.dims = (len(layers), config.hidden_size, first.num_heads, first.num_kv_heads,
                     first.head_dim, config.intermediate_size)
        self.eps, self.scale = float(model.norm.eps), float(first.scale)
        self.final_norm = model.norm.weight.detach()
        self.cos, self.sin = model.rope.cos, model.rope.sin_signed
        self.embed = model.embed_tokens.weight.detach()
        self.lm_head = one_row(model.lm_head)
        head = _native_kernel((self.lm_head, model.lm_head))
        # The LM head's native kernel, when it has one: for greedy steps without Python
        # between them (a draft's proposal, greedy_rows).
        rows_head = native_linear(head) if head is not None else None
        self.native_head = rows_head if self.embed.is_contiguous() else None
        # A verification's few rows: the native kernel serves any row count, where the
        # LM head's pick for few rows is its one-row winner (2048x256 at 4 rows on the
        # demo model: 0.26 ms on MKL's one-row choice, 0.05-0.1 native).
        self.head_rows = head or model.lm_head
        # greedy_rows' LM head: the native kernel, where it is also what forward would
        # call (at one row forward calls the one-row pick, which may be another kernel).
        self._rows_head = rows_head
        self._one_row_head = head is not None and self.lm_head is head
        self._logits = torch.empty(0)     # greedy_rows' logits, grown to the rows asked
        # The one-call paths' arguments, kept and grown rather than made per call: a
        # verification round or a burst of steps makes two calls, where building torch
        # tensors for the ids, the table and the states cost more than the calls' own
        # Python (benchmarks/llm/README.md, "Speculative rounds on a Zen 4").
        self._ids = _Int64Buffer()
        self._table = _Int64Buffer()
        self._out = _Int64Buffer()
        self._x = torch.empty(0)
        self.f32_prefetch: PrefetchChoice | None = None    # set by build

    @classmethod
    def build(cls, model: LlamaModel, kv_cache: KVCache, *,
              pick_prefetch: bool = True) -> NativeDecoder | None:
        """The decoder, or None where it cannot run. ``pick_prefetch``: measure the fp32
        kernel's next-tile fetch on this model's layers and set it for the process (a
        draft's decoder leaves its target's setting)."""
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
                if found is not None and (kernel := _own_kernel(lib, *found, budget)):
                    own.append(kernel)
                    own[-1].move_to_huge_pages()
                    budget -= kernel.read_bytes
                    lin = native_linear(own[-1])
                if lin is None:
                    return None
                linears.append(lin)
            layers.append(NativeLayer(plan.norm1.data_ptr(), plan.norm2.data_ptr(), *linears,
                                 kv_cache.k[i].data_ptr(), kv_cache.v[i].data_ptr()))
        if len(eps) != 1:
            return None         # decode.c takes one epsilon for every norm
        decoder = cls(model, kv_cache, lib, layers, own)
        if pick_prefetch:
            # Its verifications' fp32 products: whether the next tile is fetched, measured.
            decoder.f32_prefetch = choose_f32_prefetch(
                [F32Linear(lin.n, lin.k, lin.kp, lin.w, lin.bias) for layer in layers
                 for lin in (layer.qkv, layer.o, layer.gate_up, layer.down) if lin.kind == 0],
                lib)
        return decoder

    def run(self, items: Seq[StepItem]) -> torch.Tensor:
        """The step backend's entry point, for a step of one item of a few new tokens."""
        it = items[0]
        return self.forward(it.token_ids, it.start, it.block_table, it.num_logits)

    @torch.inference_mode()
    def step(self, token: int, position: int, block_table: list[int]) -> torch.Tensor:
        """As ``LeanDecoder.step``: feed ``token`` at ``position``, write its keys and
        values to the cache, return the next token's ``[1, vocab]`` float logits."""
        return self.forward([token], position, block_table, 1)

    def _blocks_used(self, start: int, rows: int, block_table: list[int]) -> int:
        """How many of the table's blocks a step of ``rows`` tokens at ``start`` reads; a
        table too short is refused (the C step would read past it)."""
        used = (start + rows - 1) // self.block_size + 1
        if len(block_table) < used:
            raise ValueError(f"block table of {len(block_table)} blocks has no block for "
                             f"position {start + rows - 1}")
        return used

    def _step_inputs(self, tokens: list[int], start: int,
                     block_table: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's activations (the tokens' embeddings, a copy the C step overwrites)
        and the block table as far as the step reads it; a table too short is refused
        (the C step would read past it)."""
        rows = len(tokens)
        used = self._blocks_used(start, rows, block_table)
        x = (self.embed[tokens[0]].clone() if rows == 1
             else self.embed.index_select(0, torch.tensor(tokens, dtype=torch.long)))
        return x, torch.tensor(block_table[:used], dtype=torch.long)

    @torch.inference_mode()
    def forward(self, tokens: list[int], start: int, block_table: list[int],
                num_logits: int) -> torch.Tensor:
        """Feed ``tokens`` at positions ``start...`` (everything before them cached; a few
        rows: the attention is one query row at a time); returns the last
        ``num_logits`` rows' ``[num_logits, vocab]`` float logits."""
        rows = len(tokens)
        x, table = self._step_inputs(tokens, start, block_table)
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

    def greedy_rows(self, tokens: list[int], start: int,
                    block_table: list[int]) -> list[int] | None:
        """As ``forward(tokens, start, block_table, len(tokens))`` followed by each row's
        argmax, in one call into C: the greedy choice after every fed token (a plain
        greedy decode step, a speculative verification). None where the LM head forward
        would use for these rows is not a native kernel (then the choices could differ
        in rounding)."""
        rows = len(tokens)
        head = self._rows_head
        if head is None or (rows == 1 and not self._one_row_head) or not self.embed.is_contiguous():
            return None
        used = self._blocks_used(start, rows, block_table)
        self._check_ids(tokens)
        if self._logits.numel() < rows * head.n:
            self._logits = torch.empty(rows * head.n)
        if self._x.numel() < rows * self.dims[1]:
            self._x = torch.empty(rows * self.dims[1])
        rc = self.lib.greedy_rows(ctypes.addressof(self.layers), *self.dims, self.eps,
                                  self.scale, self.final_norm.data_ptr(), self.cos.data_ptr(),
                                  self.sin.data_ptr(), self._table.fill(block_table[:used]),
                                  self.block_size, ctypes.addressof(head), self.embed.data_ptr(),
                                  self._ids.fill(tokens), start, rows, self._x.data_ptr(),
                                  self._logits.data_ptr(), self._out.reserve(rows))
        if rc:
            raise MemoryError("native greedy rows: no memory for their buffers")
        return self._out.read(rows)

    def _check_ids(self, ids: list[int]) -> None:
        """The C side reads the ids' embedding rows unchecked: refuse any outside them."""
        if min(ids) < 0 or max(ids) >= self.embed.shape[0]:
            raise ValueError(f"token ids must be in [0, {self.embed.shape[0]}), got "
                             f"{min(ids)}..{max(ids)}")

    def can_run_greedy(self) -> bool:
        return self.native_head is not None

    def can_run_steps(self) -> bool:
        """Whether ``greedy`` gives what one-row ``greedy_rows`` calls give: its LM head
        is also the one-row pick."""
        return self.native_head is not None and self._one_row_head

    def greedy(self, feed: list[int], start: int, block_table: list[int],
               steps: int) -> list[int]:
        """As ``SingleSequenceDecoder.greedy``, LM head and argmax included, in one call
        (``can_run_greedy``: the LM head has a native kernel)."""
        assert self.native_head is not None
        used = (start + len(feed) + steps - 2) // self.block_size + 1
        if len(block_table) < used or not feed or steps < 1:
            raise ValueError(f"greedy steps need a feed, a step and a block for position "
                             f"{start + len(feed) + steps - 2}")
        self._check_ids(feed)
        rc = self.lib.greedy_steps(ctypes.addressof(self.layers), *self.dims, self.eps,
                                   self.scale, self.final_norm.data_ptr(), self.cos.data_ptr(),
                                   self.sin.data_ptr(), self._table.fill(block_table[:used]),
                                   self.block_size, self.embed.data_ptr(),
                                   ctypes.addressof(self.native_head), self._ids.fill(feed),
                                   len(feed), start, steps, self._out.reserve(steps))
        if rc:
            raise MemoryError("native greedy steps: no memory for their buffers")
        return self._out.read(steps)


class _Int64Buffer:
    """A ctypes int64 array reused across calls, grown (doubling) when too short."""

    def __init__(self) -> None:
        self._data = (ctypes.c_int64 * 16)()

    def reserve(self, n: int) -> int:
        """The address of room for ``n`` values."""
        if len(self._data) < n:
            self._data = (ctypes.c_int64 * max(n, 2 * len(self._data)))()
        return ctypes.addressof(self._data)

    def fill(self, values: list[int]) -> int:
        """``values`` copied in; their address."""
        address = self.reserve(len(values))
        self._data[:len(values)] = values  # type: ignore[assignment]  # ints go in as-is
        return address

    def read(self, n: int) -> list[int]:
        return self._data[:n]
