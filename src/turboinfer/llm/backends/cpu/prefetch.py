"""How far ahead the native kernels prefetch their weight streams, measured at load.

A batch-1 decode step streams every layer's weights from memory once, and at one row the
kernels wait on memory, not on arithmetic: how many bytes ahead of the stream they ask
for lines decides how much of the memory's bandwidth one core gets. The best distance
depends on the CPU and on the kernel: on an Intel Xeon (Emerald Rapids) the int4 layers of
a 30-layer model took 10.0 ms per step 256 bytes ahead and 6.6 ms 4 KiB ahead, while its
AMX LM head was fastest 1 KiB ahead and slowest 4 KiB ahead; on an AMD Zen 5 the int8
kernel ran slower 1 KiB ahead than 256 bytes. So each kernel family (int8, int4, AMX, q8) has
its own distance, chosen per load: the model's one-row products (every layer's one-row
native kernel, in model order, as a step runs them, so that each family meets the caches
the others leave) are timed with one family's distance at each candidate in interleaved
rounds, the others' at their choice so far (the family with the most bytes first), and the
fastest is kept for the library (one setting per family for the process: it runs one
model's steps). ``PrefetchChoice`` records the
timings (``llm bench --json``).

The fp32 kernel fetches nothing ahead at one row (the hardware prefetcher follows its one
stream); at several rows (a speculative verification, a batch) it can fetch ahead while
it works. Its 256-bit tiles fetch the next tile: that helped on a Zen 3 and cost a Zen 4
10-25% at 2-9 rows. Where the CPU has AVX-512 its several-row passes can also run on
512-bit registers, the first pass of 4 rows or more fetching a distance ahead in the
weight stream: on a quiet Zen 4 that hid the stream under the arithmetic (4-8 rows
1.1-1.25x the 256-bit tiles), with busy neighbours 9 rows ran 5-15% slower. So the
setting picks both (below the library's ``f32_wide_from``: the 256-bit tiles, 0 or
next tile; from it: the 512-bit passes and their distance), and ``choose_f32_prefetch`` times the
native step's fp32 layers at a few rows at each of ``f32_settings(library)`` when the
step is built.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from turboinfer.llm.backends.cpu.kernel_candidates import NativeKernel
from turboinfer.llm.backends.cpu.kernels import SelectedLinear
from turboinfer.llm.backends.cpu.native import NativeLibrary

DISTANCES = (256, 1024, 2048, 4096)
# The fp32 setting: below the library's f32_wide_from the 256-bit tiles, 0 the hardware
# prefetcher alone and anything else the next tile fetched; from it (where the library
# has them) the 512-bit passes, fetching that many bytes ahead.
F32_SETTINGS = (0, 256)
F32_WIDE_AHEAD = (4096, 8192)
# A verification's rows: prompt lookup's shortest proposal and the draft's default one.
F32_ROWS = (4, 7)
# The layers timed, in step order, up to this many bytes of weights: enough to stream
# them from memory as a step does, while a large model's build stays short.
F32_SAMPLE_BYTES = 64 << 20
ROUNDS = 5
# Each sample runs the products at least this long: a small model's step takes tens of
# microseconds, below the timer's noise.
SAMPLE_S = 0.004


@dataclass(frozen=True)
class PrefetchChoice:
    """Per kernel family: the distance chosen (bytes), and the median milliseconds of the
    model's one-row products of that family at each distance measured."""

    chosen: dict[str, int]
    step_ms: dict[str, dict[int, float]]

    def to_dict(self) -> dict[str, object]:
        # JSON keys are strings: the distances' timings by "256", "1024", ...
        return {"chosen": dict(self.chosen),
                "step_ms": {kind: {str(d): ms for d, ms in timings.items()}
                            for kind, timings in self.step_ms.items()}}


def one_row_kernels(model: nn.Module) -> dict[str, list[NativeKernel]]:
    """The prefetching native kernels a batch-1 step calls, by family, in model order."""
    out: dict[str, list[NativeKernel]] = {}
    for module in model.modules():
        if isinstance(module, SelectedLinear):
            kernel = module.kernel_for(1)
            if isinstance(kernel, NativeKernel) and kernel.prefetch_kind is not None:
                out.setdefault(kernel.prefetch_kind, []).append(kernel)
    return out


def _products(kernels: list[NativeKernel]) -> Callable[[], None]:
    inputs = {k.in_features: torch.randn(1, k.in_features,
                                         generator=torch.Generator().manual_seed(k.in_features))
              for k in kernels}

    def run() -> None:
        for kernel in kernels:
            kernel(inputs[kernel.in_features])
    return run


@torch.inference_mode()
def choose_prefetch(model: nn.Module, library: NativeLibrary,
                    distances: tuple[int, ...] = DISTANCES,
                    rounds: int = ROUNDS) -> PrefetchChoice | None:
    """Time the model's one-row native products at each family's candidate distances,
    set the fastest on ``library`` and return the choice; None (the settings unchanged)
    where no layer runs a prefetching native kernel at one row."""
    families = one_row_kernels(model)
    if not families:
        return None
    run = _products([k for m in model.modules() if isinstance(m, SelectedLinear)
                     and isinstance(k := m.kernel_for(1), NativeKernel)])
    reps = _reps(run)
    chosen: dict[str, int] = {}
    step_ms: dict[str, dict[int, float]] = {}
    for kind in sorted(families, key=lambda f: -sum(k.read_bytes for k in families[f])):
        chosen[kind], step_ms[kind] = _choose(library, kind, distances, run, reps, rounds)
    return PrefetchChoice(chosen, step_ms)


@dataclass(frozen=True)
class F32Linear:
    """One fp32 native layer as the step holds it: addresses and sizes."""

    n: int
    k: int
    kp: int
    w: int
    bias: int | None


def f32_settings(library: NativeLibrary) -> tuple[int, ...]:
    """The fp32 settings measured for ``library``'s kernel: where it has the 512-bit
    passes, only those. Each row of a pass is what the build's one-row tile gives, to
    the bit, so a speculative verification's rows choose what plain decoding would; on
    such a build the 256-bit tiles sum in another order (a 5-row step's logits 3e-6 off
    one-row steps'), and the load's measurement picked them now and then (3 builds in
    18 on an AMD Zen 4). Without the passes the one-row tile sums as the tiles do."""
    if not library.f32_wide:
        return F32_SETTINGS
    return tuple(max(d, library.f32_wide_from) for d in F32_WIDE_AHEAD)


@torch.inference_mode()
def choose_f32_prefetch(linears: list[F32Linear], library: NativeLibrary,
                        rows: tuple[int, ...] = F32_ROWS,
                        rounds: int = ROUNDS) -> PrefetchChoice | None:
    """Time ``linears`` (in step order, the first ``F32_SAMPLE_BYTES`` of them) at each of
    ``rows`` at each of the kernel's settings (``f32_settings``), in interleaved rounds;
    set the fastest (the sum over the row counts of the median times) on ``library`` and
    return the choice, its timings keyed by setting. None (unchanged) where there is no
    fp32 layer."""
    if not linears:
        return None
    take, total = 0, 0
    while take < len(linears) and total < F32_SAMPLE_BYTES:
        total += 4 * linears[take].n * linears[take].kp
        take += 1
    linears = linears[:take]
    most = max(rows)
    inputs = {k: torch.randn(most, k, generator=torch.Generator().manual_seed(k))
              for k in {lin.k for lin in linears}}
    out = torch.empty(most * max(lin.n for lin in linears))

    def run() -> None:
        for r in rows:
            for lin in linears:
                library.f32_linear(inputs[lin.k].data_ptr(), r, lin.k, lin.w, lin.bias,
                                   lin.n, lin.kp, out.data_ptr())

    chosen, step_ms = _choose(library, "f32", f32_settings(library), run, _reps(run), rounds,
                              alternate=True)
    return PrefetchChoice({"f32": chosen}, {"f32": step_ms})


def _reps(run: Callable[[], None]) -> int:
    """How many calls of ``run`` fill a sample of ``SAMPLE_S``, after one that warms
    (pages touched, buffers allocated)."""
    run()
    start = time.perf_counter()
    run()
    return max(1, int(SAMPLE_S / max(time.perf_counter() - start, 1e-7)))


def _choose(library: NativeLibrary, kind: str, settings: tuple[int, ...],
            run: Callable[[], None], reps: int, rounds: int,
            alternate: bool = False) -> tuple[int, dict[int, float]]:
    """Time ``reps`` calls of ``run`` at each of ``kind``'s ``settings``, in ``rounds``
    interleaved rounds (``alternate``: every other round in reverse order); set the
    fastest median on ``library`` and return it with each setting's median ms."""
    before = library.set_prefetch(-1, kind)   # out of range: reads the setting in force
    samples: dict[int, list[float]] = {s: [] for s in settings}
    try:
        for i in range(rounds):
            for setting in settings[::-1 if alternate and i % 2 == 0 else 1]:
                library.set_prefetch(setting, kind)
                start = time.perf_counter()
                for _ in range(reps):
                    run()
                samples[setting].append((time.perf_counter() - start) / reps)
    finally:
        library.set_prefetch(before, kind)
    step_ms = {s: 1e3 * statistics.median(v) for s, v in samples.items()}
    chosen = min(step_ms, key=step_ms.__getitem__)
    library.set_prefetch(chosen, kind)
    return chosen, step_ms
