"""Every session is timed through ``latency.time_session``: the host clock for a CPU
session, CUDA events on the instance's stream for a torch session on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from turboinfer.bench.latency import time_session
from turboinfer.engines import EngineSettings, Precision, load_session
from turboinfer.models import ResolvedModel, resolve_model

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def digits() -> ResolvedModel:
    return resolve_model("builtin:digits-cnn")


def _feeds(model: ResolvedModel, rows: int) -> dict[str, np.ndarray]:
    assert model.entry is not None
    return dict(model.entry.example_inputs(rows))


@pytest.mark.parametrize("engine", ["onnxruntime", "torch"])
def test_a_cpu_session_is_timed_on_the_host_clock(digits: ResolvedModel, engine: str) -> None:
    session = load_session(digits.artifact, engine)
    assert getattr(session, "cuda_stream", None) is None
    durations = time_session(session, _feeds(digits, 2), min_runs=7, min_seconds=0.0,
                             warmup_runs=1)
    assert len(durations) == 7 and min(durations) > 0


def test_torch_sessions_each_run_on_their_own_thread_count(digits: ResolvedModel) -> None:
    """torch's thread count is process-wide: the last session loaded would otherwise
    decide it for every candidate that tune times afterwards."""
    one = load_session(digits.artifact, "torch", EngineSettings(intra_op_threads=1))
    two = load_session(digits.artifact, "torch", EngineSettings(intra_op_threads=2))
    before = torch.get_num_threads()
    try:
        one.run(_feeds(digits, 1))
        assert torch.get_num_threads() == 1
        two.run(_feeds(digits, 1))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@needs_cuda
def test_a_gpu_session_is_timed_with_cuda_events_host_to_host(digits: ResolvedModel) -> None:
    import time

    session = load_session(digits.artifact, "torch", EngineSettings(
        device="cuda", precision=Precision.FP16, cuda_graphs=True, max_batch_size=8))
    assert session.cuda_stream is not None  # type: ignore[attr-defined]
    feeds = _feeds(digits, 8)
    began = time.perf_counter_ns()
    durations = time_session(session, feeds, min_runs=20, min_seconds=0.0, warmup_runs=3)
    wall = time.perf_counter_ns() - began
    assert len(durations) == 20 and min(durations) > 0
    # The events bracket whole runs: together they cannot exceed the wall time.
    assert sum(durations) <= wall
