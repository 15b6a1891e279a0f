"""Linear layers on the kernel measured fastest for their shape, at load time, per machine.

No single kernel wins everywhere: on one machine torch's int8 weight-only matmul was 10x
faster with bf16 activations than with fp32 ones, on another fbgemm's dynamic-int8
linear beat fp32 4.6x at one row, and the fp32 layout MKL prefers depends on the row
count. So for every distinct linear shape of the model, each candidate of the weight
format (``kernel_candidates.py``) is built and timed on that shape at the row counts
the engine runs (1 for batch-1 decode, 16 for a busy batch, 512 for an fp32 prompt chunk), in
interleaved rounds, and the fastest per row count is kept. A layer then holds the winner
for each (one object where they are the same kernel) and picks by the rows of each call:
on one machine MKL's weight packed for 16 rows took 48 ms at 512 rows where the
transposed weight took 41. Decisions are kept per process, so a second model of the same
shapes loads without timing again, and per machine on disk (``decision_cache``), so a
second process does too. ``KernelChoice`` records what was timed and chosen
(``llm bench --json``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil
import torch
from torch import nn

from turboinfer.hardware.cpu import read_cpu
from turboinfer.llm.backends.cpu import decision_cache
from turboinfer.llm.backends.cpu.kernel_candidates import (
    NATIVE_KERNELS,
    Candidate,
    Kernel,
    NativeInt4Kernel,
    NativeKernel,
    absent_candidates,
    candidates,
    half_storage,
    mkl_packing_available,
    supports,
)
from turboinfer.llm.backends.cpu.native import native_status
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.loader import INT4_GROUPS_ATTR
from turboinfer.llm.model.quant import NATIVE_GROUP, layer_mode, reused_quantization
from turboinfer.llm.model.quant_device import QuantLinear
from turboinfer.llm.model.quant_device import read_bytes as quantized_read_bytes

ROW_COUNTS = (1, 16)
# A prompt chunk (the engine's default token budget per step). Compute-bound, so timed
# on one weight copy in fewer rounds, without a second warm-up, and a candidate 2x
# slower than the best on its first call is dropped: each call takes tens of
# milliseconds. A layer builds its own kernel for prompt chunks (often one more copy of
# the weight) only when that is this much faster there than its many-rows kernel.
PREFILL_ROWS = 512
PREFILL_ROUNDS = 3
PREFILL_DROP_FACTOR = 2.0
PREFILL_MIN_GAIN = 0.9
# The prompt-chunk kernels' own weight copies may take at most this share of the memory
# available at load: a faster prefill is not worth running a large model out of memory.
PREFILL_MEMORY_SHARE = 0.25
ROUNDS = 5
# A weight past this many fp32 bytes is timed on its first rows only (whole tiles): at one
# or 16 rows a product this size streams from memory (4x the largest L3 met here), and
# the time per row of a kernel stays what it is on the whole weight; at a prompt chunk
# the products are compute-bound, as they are on a slice of a quarter of that. A 1.2 B
# Llama's 128,256-row LM head (1 GB in fp32) took 52 of its 103 s of load, timed whole.
MEASURE_SLICE_BYTES = 128 * 2**20
PREFILL_SLICE_BYTES = 32 * 2**20
SLICE_ROW_MULTIPLE = 64     # whole tiles of every native layout (4 and 16 rows)
# At one row a native kernel within this factor of the fastest is chosen: a lone
# sequence's decode step runs as one call into C only where every layer has a native
# kernel (native_decode.py beside this module), which saved more than this on every model
# measured (110M Llama: 1.13x fp32, 1.43x int8, 1.57x int4 per token), while a single
# product's timing cannot see it; the one-row timings of close kernels also swap from load
# to load.
NATIVE_STEP_MARGIN = 1.25
# Blocks of each kernel when a native one lost at one row by more than the margin.
CONFIRM_ROUNDS = 3
MAX_COPIES = 16             # weight copies rotated through, so timing reads from memory
ROUND_BUDGET_S = 0.01       # per candidate and round; at least one call
DROP_FACTOR = 4.0           # a candidate this much slower on its first call is not timed on


@dataclass(frozen=True)
class KernelChoice:
    """The kernel chosen for one weight shape at one row count, and every timing."""

    mode: str
    out_features: int
    in_features: int
    rows: int
    chosen: str
    timings_ms: dict[str, float]
    layers: int = 0
    # The output rows timed, where fewer than out_features (a large weight's first rows).
    timed_out_features: int = 0
    # Candidates dropped after one call (much slower than the best first call).
    dropped: tuple[str, ...] = field(default=())
    # Candidates not offered on this machine, with the reason (no C compiler, ...).
    absent: dict[str, str] = field(default_factory=dict)
    # Read back from an earlier process's measurement on this machine (decision_cache).
    remembered: bool = False

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def time_kernels(kernels: dict[str, list[Kernel]], x: torch.Tensor,
                 rounds: int = ROUNDS, per_call: dict[str, float] | None = None,
                 best: dict[str, float] | None = None) -> dict[str, float]:
    """Median milliseconds per call of each kernel on ``x``, in interleaved rounds; each
    call goes to the next of the kernel's copies. ``per_call`` (seconds, of warm calls)
    sizes the rounds without another warm-up. ``best``, where given, gets each kernel's
    fastest round (ms per call)."""
    if per_call is None:
        per_call = {}
        for name, copies in kernels.items():
            for kernel in copies:
                kernel(x)
            start = time.perf_counter()
            copies[0](x)
            per_call[name] = time.perf_counter() - start
    reps = {n: max(len(kernels[n]), int(ROUND_BUDGET_S / max(t, 1e-7)))
            for n, t in per_call.items()}
    samples: dict[str, list[float]] = {n: [] for n in kernels}
    for _ in range(rounds):
        for name, copies in kernels.items():
            start = time.perf_counter()
            for i in range(reps[name]):
                copies[i % len(copies)](x)
            samples[name].append((time.perf_counter() - start) / reps[name])
    if best is not None:
        best.update({n: 1e3 * min(s) for n, s in samples.items()})
    return {n: 1e3 * statistics.median(s) for n, s in samples.items()}


_LLC_BYTES: list[int] = []


def last_level_cache_bytes() -> int:
    """The L3 of the hardware profile (32 MiB when it does not say), read once."""
    if not _LLC_BYTES:
        l3 = read_cpu().caches.l3
        _LLC_BYTES.append(l3.total_bytes if l3 else 32 * 2**20)
    return _LLC_BYTES[0]


@torch.inference_mode()
def measure_shape(cands: list[Candidate], weight: torch.Tensor, bias: torch.Tensor | None,
                  rows: int, mode: QuantMode) -> KernelChoice:
    """Build every candidate for ``weight`` and time it on ``rows`` random rows.

    In the model every decode step streams all layers' weights from memory, so a weight
    smaller than the last-level cache is timed as several copies called in turn (their
    total twice the cache), not as one copy that stays cached between calls. A prompt
    chunk (``PREFILL_ROWS`` or more) reuses each weight across its rows: one copy. A
    large weight is timed on its first rows (``MEASURE_SLICE_BYTES``).
    """
    prefill = rows >= PREFILL_ROWS
    n = weight.shape[0]
    limit = PREFILL_SLICE_BYTES if prefill else MEASURE_SLICE_BYTES
    keep = max(SLICE_ROW_MULTIPLE,
               limit // (4 * weight.shape[1]) // SLICE_ROW_MULTIPLE * SLICE_ROW_MULTIPLE)
    if n > keep:
        weight, bias = weight[:keep], None if bias is None else bias[:keep]
    x = torch.randn(rows, weight.shape[1], generator=torch.Generator().manual_seed(rows))
    kernels: dict[str, list[Kernel]] = {}
    first: dict[str, float] = {}
    dropped: list[str] = []
    for cand in cands:
        try:
            kernel = cand.build(weight, bias, rows)
            kernel(x)
        except (RuntimeError, NotImplementedError):
            continue  # not built for this CPU or shape
        start = time.perf_counter()
        kernel(x)
        first[cand.name] = time.perf_counter() - start
        # A native kernel at one row is always timed: one preempted first call must not
        # cost a lone sequence its one-call decode step (see NATIVE_STEP_MARGIN).
        keep = rows == 1 and cand.name in NATIVE_KERNELS
        factor = PREFILL_DROP_FACTOR if prefill else DROP_FACTOR
        if not keep and first[cand.name] > factor * min(first.values()):
            dropped.append(cand.name)
            continue
        copies = (1 if prefill else
                  min(MAX_COPIES, math.ceil(2 * last_level_cache_bytes() / kernel.read_bytes)))
        kernels[cand.name] = [kernel] + [cand.build(weight, bias, rows)
                                         for _ in range(copies - 1)]
    best: dict[str, float] = {}     # each kernel's fastest round, few-row timings only
    if prefill:
        # Prompt chunks run on the general path, where native kernels run solo
        # (runner.py): timed so.
        library = native_status().library
        solo = library is not None and library.solo
        if library is not None:
            library.set_solo(True)
        try:
            timings = time_kernels(kernels, x, PREFILL_ROUNDS, {n: first[n] for n in kernels})
        finally:
            if library is not None:
                library.set_solo(solo)
    else:
        timings = time_kernels(kernels, x, best=best)
    timings.update({n: 1e3 * first[n] for n in dropped})
    chosen = min(kernels, key=timings.__getitem__)
    native = min((n for n in kernels if n in NATIVE_KERNELS), key=timings.__getitem__,
                 default=None)
    if rows == 1 and native is not None and native != chosen and (
            timings[native] <= NATIVE_STEP_MARGIN * timings[chosen]
            or best.get(native, math.inf) <= NATIVE_STEP_MARGIN * best.get(chosen, 0.0)
            or _confirmed_close(kernels[native], kernels[chosen], x)):
        # By the medians, by each kernel's fastest round (noise only adds time), or by
        # the two timed again apart: at two threads on a shared 2-core machine a native
        # kernel timed among torch's kernels measured 2-10x its own time in every round
        # now and then (0.12 against 0.011 ms), which cost the demo draft its one-call
        # steps (4 of them 1.5 ms instead of 0.13) and its speculative decoding most of
        # its gain.
        chosen = native
    return KernelChoice(mode.value, n, weight.shape[1], rows, chosen, timings,
                        dropped=tuple(dropped),
                        timed_out_features=weight.shape[0] if weight.shape[0] < n else 0)


def _confirmed_close(native: list[Kernel], other: list[Kernel], x: torch.Tensor) -> bool:
    """Whether ``native`` is within NATIVE_STEP_MARGIN of ``other`` timed apart, as a
    decode step calls it: each kernel's rounds back to back (``time_kernels`` on it
    alone; its first round a warm-up after whatever ran before), the fastest of
    ``CONFIRM_ROUNDS`` more rounds each."""
    best: dict[str, float] = {}
    for name, copies in (("native", native), ("other", other)):
        time_kernels({name: copies}, x, CONFIRM_ROUNDS + 1, best=best)
    return best["native"] <= NATIVE_STEP_MARGIN * best["other"]


class SelectedLinear(nn.Module):
    """An inference-only ``nn.Linear``: the kernel chosen for few rows up to
    ``split_rows`` rows per call, the one chosen for many up to ``prefill_split``, the
    one chosen for a prompt chunk above (``prefill``; the many-rows one when omitted)."""

    def __init__(self, small: Kernel, large: Kernel, split_rows: int,
                 in_features: int, out_features: int, *, prefill: Kernel | None = None,
                 prefill_split: int = 0) -> None:
        super().__init__()
        self.small, self.large, self.split_rows = small, large, split_rows
        self.prefill = large if prefill is None else prefill
        self.prefill_split = prefill_split if prefill is not None else 2**62
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        return self.kernel_for(flat.shape[0])(flat).view(*x.shape[:-1], self.out_features)

    def kernel_for(self, rows: int) -> Kernel:
        if rows <= self.split_rows:
            return self.small
        return self.large if rows <= self.prefill_split else self.prefill

    def held_bytes(self) -> int:
        """The weight bytes its kernels hold, each distinct kernel once, as each reads
        them (a packed copy's padding not counted)."""
        kernels = {id(k): k for k in (self.small, self.large, self.prefill)}
        return sum(k.read_bytes for k in kernels.values())

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, small={self.small.name}, "
                f"large={self.large.name}, prefill={self.prefill.name}, "
                f"split_rows={self.split_rows}, prefill_split={self.prefill_split}")


_DECISIONS: dict[tuple[object, ...], KernelChoice] = {}


def _decide(mode: QuantMode, linear: nn.Linear, rows: int, group_size: int,
            measure: bool, half: torch.dtype | None = None) -> KernelChoice:
    n, k = linear.weight.shape
    cands = candidates(mode, group_size=group_size, half=half)
    # The candidate set is part of the key: the native kernels may be absent in one
    # load (no compiler) and present in the next.
    key = (mode, n, k, linear.bias is not None, rows, group_size, torch.get_num_threads(),
           tuple(c.name for c in cands))
    if key not in _DECISIONS:
        absent = absent_candidates(mode, group_size=group_size)
        if not measure:
            return KernelChoice(mode.value, n, k, rows, cands[0].name, {}, absent=absent)
        stored_key = json.dumps([str(part) for part in key])
        remembered = _remembered(decision_cache.load(stored_key), cands)
        if remembered is not None:
            _DECISIONS[key] = dataclasses.replace(remembered, absent=absent, remembered=True)
        else:
            choice = measure_shape(cands, linear.weight.detach().float(), _bias(linear), rows,
                                   mode)
            decision_cache.store(stored_key, choice.to_dict())
            _DECISIONS[key] = dataclasses.replace(choice, absent=absent)
    return _DECISIONS[key]


def _remembered(entry: dict[str, Any] | None, cands: list[Candidate]) -> KernelChoice | None:
    """A choice read back from the decision cache, or None where there is none or it does
    not name one of today's candidates (then the shape is measured again)."""
    if entry is None:
        return None
    try:
        choice = KernelChoice(**{**entry, "dropped": tuple(entry.get("dropped", ()))})
    except TypeError:       # written by a release whose choices had other fields
        return None
    return choice if choice.chosen in {c.name for c in cands} else None


def _bias(linear: nn.Linear) -> torch.Tensor | None:
    return None if linear.bias is None else linear.bias.detach().float()


def _has_exact_int4(mode: QuantMode, linear: nn.Linear, group_size: int) -> bool:
    """Whether ``linear`` holds its file's int4 groups (a GGUF's Q4_0/Q4_1 blocks,
    ``model/loader.py``) and the native int4 kernel can run them here."""
    return (mode is QuantMode.INT4 and group_size == NATIVE_GROUP
            and getattr(linear, INT4_GROUPS_ATTR, None) is not None
            and native_status().library is not None)


def _build(mode: QuantMode, name: str, linear: nn.Linear, rows: int,
           group_size: int, half: torch.dtype | None = None) -> tuple[Kernel, bool]:
    library = native_status().library
    if (name == NativeInt4Kernel.name and library is not None
            and _has_exact_int4(mode, linear, group_size)):
        # The file's own int4 groups, bit for bit.
        exact = NativeInt4Kernel(library, linear.weight, _bias(linear),
                                 getattr(linear, INT4_GROUPS_ATTR))
        exact.move_to_huge_pages()
        return exact, False
    cand = next(c for c in candidates(mode, group_size=group_size, half=half)
                if c.name == name)
    kernel = cand.build(linear.weight.detach().float(), _bias(linear), rows)
    if isinstance(kernel, NativeKernel):
        kernel.move_to_huge_pages()
    return kernel, cand.rows_specific


def _weight_bytes(linear: nn.Linear) -> int:
    return linear.weight.numel() * 4        # a copy is kept in float32 at most


def _worth_a_kernel(choice: KernelChoice, many_rows: str) -> bool:
    """Whether the prompt-chunk winner beats the many-rows kernel at chunk size by enough
    to hold its own copy of the weight."""
    if choice.chosen == many_rows:
        return False
    other = choice.timings_ms.get(many_rows)
    return other is None or choice.timings_ms[choice.chosen] < PREFILL_MIN_GAIN * other


def select_kernels(model: nn.Module, mode: QuantMode, *, group_size: int = 32,
                   row_counts: tuple[int, int] = ROW_COUNTS,
                   prefill_rows: int = PREFILL_ROWS,
                   few_rows_only: tuple[str, ...] = ("lm_head",),
                   measure: bool = True,
                   prefill_budget_bytes: int | None = None) -> list[KernelChoice]:
    """Swap every ``nn.Linear`` for a ``SelectedLinear`` on the measured-fastest kernels.

    A layer the format cannot hold (int4 needs whole groups) keeps fp32 candidates. A tied
    LM head gets its own copy (int8 under int4: ``layer_mode``); the embedding table stays
    in float. ``measure=False``
    takes each format's first candidate without timing. ``prefill_rows`` (0: none) adds
    a third row count for prompt chunks to fp32 layers, except for those named in
    ``few_rows_only``: the engine projects only the rows it samples from through the LM
    head, and timing its 32000-wide product at 512 rows would take seconds. The weight
    copies the prompt-chunk kernels add stay within ``prefill_budget_bytes`` (default: a
    quarter of the memory available now); a layer past it runs prompt chunks on its
    many-rows kernel. Returns one ``KernelChoice`` per distinct shape and row count,
    with how many layers use it.
    """
    budget = (int(PREFILL_MEMORY_SHARE * psutil.virtual_memory().available)
              if prefill_budget_bytes is None else prefill_budget_bytes)
    few, many = row_counts
    split = int(math.sqrt(few * many))
    # Twice the many-rows count, not the geometric mean: a kernel chosen for 16 rows
    # (the native ones especially) fell behind the 512-row winner from 24-48 rows on
    # (at 64 rows 1.2-1.3x slower for the 110M model's shapes).
    prefill_split = 2 * many
    used: dict[tuple[object, ...], tuple[KernelChoice, int]] = {}
    with torch.inference_mode(), reused_quantization():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if not isinstance(child, nn.Linear):
                    continue
                wanted = layer_mode(mode, name)
                fmt = (wanted if supports(wanted, child.out_features, child.in_features,
                                          group_size) else QuantMode.NONE)
                # fp32 only: a quantized format's 512-row winner may quantize activations
                # differently from its few-rows kernels (per tensor instead of per row),
                # which moves its accuracy, not only its speed.
                tiers = ((few, many) if not prefill_rows or name in few_rows_only
                         or fmt is not QuantMode.NONE else (few, many, prefill_rows))
                # An fp32 weight that is exactly fp16 or bf16 (a half-precision
                # checkpoint) may also run on a native kernel that keeps it in 16 bits.
                half = (half_storage(child.weight.detach().float())
                        if fmt is QuantMode.NONE and native_status().library is not None
                        else None)
                if _has_exact_int4(fmt, child, group_size):
                    # The file's own int4 groups run on the one kernel that takes them as
                    # they are, at every row count: another candidate would quantize the
                    # float weights again, onto another grid (a Q4_0 file's perplexity
                    # 15.2 instead of 14.1 where torch's int4 kernel won at 16 rows).
                    choices = [KernelChoice(fmt.value, child.out_features, child.in_features,
                                            rows, NativeInt4Kernel.name, {})
                               for rows in tiers]
                else:
                    choices = [_decide(fmt, child, rows, group_size, measure, half)
                               for rows in tiers]
                for choice in choices:
                    key = (choice.mode, choice.out_features, choice.in_features, choice.rows)
                    used[key] = (choice, used.get(key, (choice, 0))[1] + 1)
                kernels = [choice.chosen for choice in choices]
                small, specific = _build(fmt, kernels[0], child, few, group_size, half)
                large = (small if kernels[1] == kernels[0] and not specific
                         else _build(fmt, kernels[1], child, many, group_size, half)[0])
                prefill = None
                if len(tiers) == 3 and _worth_a_kernel(choices[2], kernels[1]):
                    built = {kernels[0]: small, kernels[1]: large}
                    if kernels[2] in built and not specific:
                        prefill = built[kernels[2]]
                    elif _weight_bytes(child) <= budget:
                        prefill = _build(fmt, kernels[2], child, prefill_rows,
                                         group_size, half)[0]
                        budget -= _weight_bytes(child)
                setattr(parent, name, SelectedLinear(small, large, split, child.in_features,
                                                     child.out_features, prefill=prefill,
                                                     prefill_split=prefill_split))
    return [dataclasses.replace(c, layers=n) for c, n in used.values()]


# -- the fixed fp32 layout, without measurement -----------------------------------------

class FastLinear(nn.Module):
    """A drop-in inference-only ``nn.Linear``: transposed weight, optional MKL packing
    for ``batch_hint`` rows (at other row counts MKL falls back to the transposed view)."""

    def __init__(self, linear: nn.Linear, batch_hint: int = 0) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.weight_t: torch.Tensor
        self.register_buffer("weight_t", weight.t().contiguous(), persistent=False)  # [in, out]
        self.packed: torch.Tensor | None = None
        if batch_hint > 0:
            self.packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, batch_hint)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(),
                                                                  requires_grad=False)
        self.batch_hint = batch_hint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if self.packed is not None:
            out = torch.ops.mkl._mkl_linear(flat, self.packed, self.weight_t.t(), self.bias,
                                            self.batch_hint)
        elif self.bias is not None:
            out = torch.addmm(self.bias, flat, self.weight_t)
        else:
            out = flat @ self.weight_t
        return out.view(*x.shape[:-1], -1)


def pack_linear_layers(model: nn.Module, batch_hint: int) -> int:
    """Swap every fp32 ``nn.Linear`` for a ``FastLinear``; returns how many.

    ``batch_hint`` > 0 also packs each weight for that many rows where MKL can.
    """
    hint = batch_hint if batch_hint > 0 and mkl_packing_available() else 0
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and child.weight.dtype == torch.float32:
                setattr(parent, name, FastLinear(child, hint))
                replaced += 1
    return replaced


def read_bytes_per_token(model: nn.Module) -> int:
    """Bytes of weights one batch-1 decode step reads: every linear layer's weight as its
    one-row kernel stores it (a quantized layer of the general path: its stored tensors),
    one embedding row, and the other modules' own parameters (norms) whole."""
    total = 0
    for module in model.modules():
        if isinstance(module, SelectedLinear):
            total += module.kernel_for(1).read_bytes
        elif isinstance(module, FastLinear):
            total += _size(module.weight_t) + (0 if module.bias is None else _size(module.bias))
        elif isinstance(module, nn.Embedding):
            total += module.weight.shape[1] * module.weight.element_size()
        elif isinstance(module, QuantLinear):
            total += quantized_read_bytes(module)
        else:
            total += sum(_size(p) for p in module.parameters(recurse=False))
    return total


def _size(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
