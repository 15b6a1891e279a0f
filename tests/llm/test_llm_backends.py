"""The step backends behind one interface: which one a step goes to (backends/select.py),
and the general torch backend on an explicit device."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import torch

from turboinfer.llm.backends import select
from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.cpu import kernel_candidates, prefetch
from turboinfer.llm.backends.cpu.batch_decode import BatchDecoder
from turboinfer.llm.backends.cpu.kernels import SelectedLinear
from turboinfer.llm.backends.cpu.native import native_status
from turboinfer.llm.backends.cpu.native.loader import PREFETCH_KINDS
from turboinfer.llm.backends.cpu.native_decode import NativeDecoder
from turboinfer.llm.backends.runner import ModelRunner
from turboinfer.llm.backends.torch.lean_decode import LeanDecoder
from turboinfer.llm.backends.torch.packed import TorchBackend
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.loader import load_model


def _choose(runner: ModelRunner, items: list[StepItem]) -> object:
    return select.choose_step(items, runner._lone, runner._batched)


@pytest.fixture()
def native_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the native kernels are offered, so the measurement has to pick them."""
    if native_status().library is None:
        pytest.skip(f"native kernels absent: {native_status().reason}")
    monkeypatch.setattr(kernel_candidates, "_torch_candidates", lambda mode, group: [])


ONE = [StepItem([5], 8, [0, 1, 2], 1)]
VERIFY = [StepItem([5, 6, 7], 8, [0, 1, 2], 3)]
PROMPT = [StepItem(list(range(select.NATIVE_ROWS + 1)), 0, [0, 1, 2, 3, 4], 1)]
DECODES = [StepItem([5], 8, [0, 1, 2], 1), StepItem([6], 3, [3], 1)]
MIXED = [StepItem([5], 8, [0, 1, 2], 1), StepItem([6, 7, 8], 0, [3], 1)]


def test_each_step_goes_to_the_backend_that_covers_it(tiny_llama_dir: Path) -> None:
    """Torch's own kernels (no native step): a lone token to the lean decoder, several
    sequences' tokens to the batched native step where its library loaded, the rest
    to the general path; a path switched off leaves its steps to the general one."""
    model = load_model(tiny_llama_dir)
    runner = ModelRunner(model, model.allocate_kv_cache(16, 4))
    assert isinstance(_choose(runner, ONE), LeanDecoder)
    assert _choose(runner, VERIFY) is None and _choose(runner, PROMPT) is None
    batched = _choose(runner, DECODES)
    assert (isinstance(batched, BatchDecoder) if native_status().library is not None
            else batched is None)
    assert _choose(runner, MIXED) is None
    runner.lean_decode = runner.batch_decode = False
    assert _choose(runner, ONE) is None and _choose(runner, DECODES) is None


def test_native_kernels_throughout_take_the_native_step(tiny_llama_dir: Path,
                                                       native_only: None) -> None:
    """A lone sequence's steps of up to NATIVE_ROWS tokens, verifications included."""
    model = load_model(tiny_llama_dir)
    select.measure(model, QuantMode.NONE, group_size=32, pick_threads=False)
    runner = ModelRunner(model, model.allocate_kv_cache(16, 4))
    assert isinstance(_choose(runner, ONE), NativeDecoder)
    assert isinstance(_choose(runner, VERIFY), NativeDecoder)
    assert _choose(runner, PROMPT) is None
    assert runner.decode_path() == "native"
    # The general path's kernels run solo (torch's operators want the cores), the native
    # step's on the workers.
    library = native_status().library
    assert library is not None
    runner.run(PROMPT)
    assert library.solo
    runner.run([StepItem([5], select.NATIVE_ROWS + 1, [0, 1, 2, 3, 4], 1)])
    assert not library.solo


def test_the_prefetch_distance_is_measured_on_the_models_one_row_kernels(
        tiny_llama_dir: Path, native_only: None) -> None:
    library = native_status().library
    assert library is not None
    default = library.set_prefetch(-1)
    try:
        model = load_model(tiny_llama_dir)
        measured = select.measure(model, QuantMode.INT4, group_size=32, pick_threads=False)
        choice = measured.prefetch
        families = prefetch.one_row_kernels(model)
        # int4 projections, and the LM head in int8 (on AMX where it runs).
        assert "int4" in families and len(families) == 2
        assert choice is not None and set(choice.chosen) == set(families)
        for kind, timings in choice.step_ms.items():
            assert set(timings) == set(prefetch.DISTANCES)
            assert timings[choice.chosen[kind]] == min(timings.values())
            assert library.set_prefetch(-1, kind) == choice.chosen[kind]   # left in force
        layers = [m for m in model.modules() if isinstance(m, SelectedLinear)]
        assert sum(len(k) for k in families.values()) == len(layers) > 1
        assert orjson.loads(orjson.dumps(choice.to_dict()))["step_ms"]["int4"].keys() == {
            str(d) for d in prefetch.DISTANCES}            # as llm bench --json writes it
        # Not asked for (a draft's load), or no prefetching kernel at one row: unchanged.
        library.set_prefetch(512)
        again = load_model(tiny_llama_dir)
        assert select.measure(again, QuantMode.INT4, group_size=32, pick_threads=False,
                              pick_prefetch=False).prefetch is None
        fp32 = load_model(tiny_llama_dir)
        select.measure(fp32, QuantMode.NONE, group_size=32, pick_threads=False,
                       pick_prefetch=False)
        assert prefetch.choose_prefetch(fp32, library) is None      # fp32_native: none
        assert prefetch.choose_prefetch(load_model(tiny_llama_dir), library) is None
        assert all(library.set_prefetch(-1, kind) == 512 for kind in PREFETCH_KINDS)
    finally:
        library.set_prefetch(default)


def _greedy(backend: ModelRunner | TorchBackend, prompt: list[int], table: list[int],
            steps: int) -> tuple[list[int], list[torch.Tensor]]:
    feed, start, ids, logits = prompt, 0, [], []
    for _ in range(steps):
        out = backend.run([StepItem(feed, start, table, 1)])
        start += len(feed)
        feed = [int(out[0].argmax())]
        ids.append(feed[0])
        logits.append(out[0].cpu())
    return ids, logits


def test_the_torch_backend_is_the_runners_general_path(tiny_llama_dir: Path) -> None:
    """On an explicit device, the same logits bit for bit as the runner with its other
    paths off; a device the cache is not on is refused."""
    model = load_model(tiny_llama_dir)
    general = ModelRunner(model, model.allocate_kv_cache(8, 4), lean_decode=False)
    general.batch_decode = False
    torch_backend = TorchBackend(model, model.allocate_kv_cache(8, 4),
                                 device=torch.device("cpu"))
    prompt, table = [(3 * j + 1) % 128 for j in range(7)], [2, 0, 5, 1, 3, 4, 6, 7]
    want_ids, want = _greedy(general, prompt, table, 12)
    got_ids, got = _greedy(torch_backend, prompt, table, 12)
    assert got_ids == want_ids
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    with pytest.raises(ValueError, match="not on meta"):
        TorchBackend(model, model.allocate_kv_cache(8, 4), device=torch.device("meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_model_on_a_cuda_device_runs_on_the_torch_backend(tiny_llama_dir: Path) -> None:
    """The runner of a model on the GPU takes the general path for every step (the lean
    and native paths are the CPU's), with the CPU's greedy tokens."""
    cpu_model: LlamaModel = load_model(tiny_llama_dir)
    gpu_model: LlamaModel = load_model(tiny_llama_dir).to("cuda")
    prompt, table = [(5 * j + 2) % 128 for j in range(9)], [1, 0, 3, 2, 5, 4, 7, 6]
    cpu = ModelRunner(cpu_model, cpu_model.allocate_kv_cache(8, 4), lean_decode=False)
    cpu.batch_decode = False
    gpu = ModelRunner(gpu_model, gpu_model.allocate_kv_cache(8, 4))
    assert gpu.kv_cache.k.is_cuda and gpu.decode_path() == "general"
    want_ids, want = _greedy(cpu, prompt, table, 10)
    got_ids, got = _greedy(gpu, prompt, table, 10)
    assert got_ids == want_ids
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)
    two = [StepItem([want_ids[-1]], 19, table, 1), StepItem(prompt[:3], 0, [6, 7], 1)]
    assert gpu.run(two).is_cuda
