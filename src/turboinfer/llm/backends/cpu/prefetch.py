"""How far ahead the native kernels prefetch their weight streams, measured at load.

A batch-1 decode step streams every layer's weights from memory once, and at one row the
kernels wait on memory, not on arithmetic: how many bytes ahead of the stream they ask
for lines decides how much of the memory's bandwidth one core gets. The best distance
depends on the CPU: on an Intel Xeon (Emerald Rapids) the int4 layers of a 30-layer model
took 10.0 ms per step 256 bytes ahead and 6.6 ms 4 KiB ahead, while on an AMD Zen 5 the
int8 kernel ran slower 1 KiB ahead than 256 bytes. So the distance is chosen per load:
the model's own one-row products (every layer's one-row native kernel, in model order, as
a step runs them) are timed at each candidate distance in interleaved rounds, and the
fastest is kept for the library (one setting for all kernels: the process runs one model's
steps). ``PrefetchChoice`` records the timings (``llm bench --json``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch
from torch import nn

from turboinfer.llm.backends.cpu.kernel_candidates import NativeKernel
from turboinfer.llm.backends.cpu.kernels import SelectedLinear
from turboinfer.llm.backends.cpu.native import NativeLibrary

DISTANCES = (256, 1024, 2048, 4096)
ROUNDS = 5
# Each sample runs the step's products at least this long: a small model's step takes
# tens of microseconds, below the timer's noise.
SAMPLE_S = 0.004


@dataclass(frozen=True)
class PrefetchChoice:
    """The distance chosen (bytes) and the median milliseconds of the model's one-row
    products at each distance measured."""

    chosen: int
    step_ms: dict[int, float]

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def one_row_kernels(model: nn.Module) -> list[NativeKernel]:
    """The native kernels a batch-1 step calls, in model order."""
    return [k for m in model.modules() if isinstance(m, SelectedLinear)
            and isinstance(k := m.kernel_for(1), NativeKernel)]


@torch.inference_mode()
def choose_prefetch(model: nn.Module, library: NativeLibrary,
                    distances: tuple[int, ...] = DISTANCES,
                    rounds: int = ROUNDS) -> PrefetchChoice | None:
    """Time the model's one-row native products at each distance, set the fastest on
    ``library`` and return the choice; None (the setting unchanged) where no layer runs
    a native kernel at one row."""
    kernels = one_row_kernels(model)
    if not kernels:
        return None
    inputs = {k.in_features: torch.randn(1, k.in_features,
                                         generator=torch.Generator().manual_seed(k.in_features))
              for k in kernels}

    def step() -> None:
        for kernel in kernels:
            kernel(inputs[kernel.in_features])

    before = library.set_prefetch(-1)     # out of range: reads the distance in force
    step()                                # warm: pages touched, activations allocated
    start = time.perf_counter()
    step()
    reps = max(1, int(SAMPLE_S / max(time.perf_counter() - start, 1e-7)))
    samples: dict[int, list[float]] = {d: [] for d in distances}
    try:
        for _ in range(rounds):
            for d in distances:
                library.set_prefetch(d)
                start = time.perf_counter()
                for _ in range(reps):
                    step()
                samples[d].append((time.perf_counter() - start) / reps)
    finally:
        library.set_prefetch(before)
    step_ms = {d: 1e3 * statistics.median(s) for d, s in samples.items()}
    chosen = min(step_ms, key=step_ms.__getitem__)
    library.set_prefetch(chosen)
    return PrefetchChoice(chosen, step_ms)
