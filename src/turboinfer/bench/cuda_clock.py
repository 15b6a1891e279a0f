"""CUDA only: timing a session's runs with CUDA events on its own stream.

The events bracket the whole run on the stream the session copies and launches on: the
start is stamped before the input copy is enqueued, the end after the run has returned
its outputs in host memory. So a figure is host to host, as a client is served, but read
from the GPU's clock: no host timer resolution or clock-read skew, and the warm-up runs
first (cuDNN algorithm choice, lazy allocations, graph uploads stay out of the figures).
Nothing here runs without a GPU; ``latency.time_session`` only calls it for a session
that has a CUDA stream, and its tests skip with "needs CUDA".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch


def time_runs_cuda(run: Callable[[Mapping[str, np.ndarray]], Any],
                   feeds: Mapping[str, np.ndarray], stream: torch.cuda.Stream, *,
                   min_runs: int, min_seconds: float, warmup_runs: int) -> list[int]:
    """Durations in ns of back-to-back runs after warm-up, by CUDA events on ``stream``."""
    for _ in range(warmup_runs):
        run(feeds)
    stream.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    durations: list[int] = []
    deadline = time.perf_counter_ns() + int(min_seconds * 1e9)
    while True:
        start.record(stream)
        run(feeds)
        end.record(stream)
        end.synchronize()  # the run already waited for its outputs: this is immediate
        durations.append(int(start.elapsed_time(end) * 1e6))
        if time.perf_counter_ns() >= deadline and len(durations) >= min_runs:
            return durations
