"""The fixed-shape decode step CUDA graphs capture, run eagerly on the CPU against the
general path; and the capture itself where CUDA exists."""

from __future__ import annotations

import pytest
import torch

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.cuda.graphs import (
    GraphDecoder,
    batch_buckets,
    bucket,
    context_bucket,
)
from turboinfer.llm.backends.torch.fused import fused_ops
from turboinfer.llm.backends.torch.packed import TorchBackend
from turboinfer.llm.backends.torch.static_decode import StaticDecodeStep
from turboinfer.llm.model.llama import EAGER_OPS, LlamaModel

BS = 4
NUM_BLOCKS = 32           # block 32 is the scratch one
TABLES = [[3, 7, 1, 12, 13], [0, 2, 10, 11], [9, 4, 5, 6, 8]]   # scattered blocks


def _prefill(backend: TorchBackend, lengths: list[int]) -> list[StepItem]:
    """Prompts of ``lengths`` into the cache; the decode items for the next token."""
    prompts = [[(7 * i + 3 * j + 1) % 128 for j in range(n)] for i, n in enumerate(lengths)]
    backend.run([StepItem(p, 0, t, 1) for p, t in zip(prompts, TABLES, strict=True)])
    return [StepItem([(5 * i + 2) % 128], n, t, 1)
            for i, (n, t) in enumerate(zip(lengths, TABLES, strict=True))]


def test_buckets() -> None:
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert batch_buckets(3) == [1, 2, 3]
    assert bucket(5, batch_buckets(64)) == 8 and bucket(65, batch_buckets(64)) is None
    assert [context_bucket(n, 100) for n in (1, 4, 5, 9, 70, 100)] == [4, 4, 8, 16, 100, 100]


@pytest.mark.parametrize("batch", [3, 4, 8])
def test_the_static_step_gives_the_general_paths_logits(tiny_model: LlamaModel,
                                                        batch: int) -> None:
    """Padded rows and padded block tables change nothing a real row sees."""
    cache = tiny_model.allocate_kv_cache(NUM_BLOCKS + 1, BS)
    general = TorchBackend(tiny_model, cache)
    items = _prefill(general, [9, 6, 17])
    before = cache.k[:, :NUM_BLOCKS].clone()
    step = StaticDecodeStep(tiny_model, cache, batch=batch, blocks=8,
                            scratch_block=NUM_BLOCKS)
    assert step.fits(items)
    got = step.run(items)
    written_static = cache.k[:, :NUM_BLOCKS].clone()
    cache.k[:, :NUM_BLOCKS] = before
    want = general.run(items)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    # The same slots written with the same keys; the scratch block took the padding.
    torch.testing.assert_close(written_static, cache.k[:, :NUM_BLOCKS], rtol=1e-5, atol=1e-5)


def test_the_graph_decoder_eagerly_decodes_like_the_general_path(tiny_model: LlamaModel,
                                                                 ) -> None:
    """Ten greedy steps of three sequences through the buckets (capture off on the CPU)
    and through the general path, each on its own cache: the same tokens."""
    runs = []
    for use_graphs in (False, True):
        cache = tiny_model.allocate_kv_cache(NUM_BLOCKS + 1, BS)
        general = TorchBackend(tiny_model, cache)
        graphs = GraphDecoder(tiny_model, cache, max_batch=8, scratch_block=NUM_BLOCKS,
                              capture=False)
        items = _prefill(general, [3, 5, 2])
        tokens = []
        for _ in range(10):
            backend = graphs if use_graphs else general
            assert not use_graphs or graphs.fits(items)
            ids = backend.run(items).argmax(-1).tolist()
            tokens.append(ids)
            items = [StepItem([t], it.start + 1, it.block_table, 1)
                     for t, it in zip(ids, items, strict=True)]
        runs.append(tokens)
        if use_graphs:
            assert graphs.num_graphs >= 1
    assert runs[0] == runs[1]


def test_the_compiled_elementwise_groups_give_the_eager_steps_logits(tiny_model: LlamaModel,
                                                                     ) -> None:
    """The fused groups' functions through torch.compile (whole graphs, dynamic shapes)
    in the static step: the eager groups' logits, at two batch buckets from one
    compilation. Compiled by aot_eager here: inductor's C++ build of the same graphs
    takes 25 s on a CPU; the CUDA test below runs inductor's Triton kernels."""
    ops = fused_ops("aot_eager")
    cache = tiny_model.allocate_kv_cache(NUM_BLOCKS + 1, BS)
    items = _prefill(TorchBackend(tiny_model, cache), [9, 6, 17])
    for step in (items, items[:1]):
        logits = [GraphDecoder(tiny_model, cache, max_batch=8, scratch_block=NUM_BLOCKS,
                               capture=False, ops=o).run(step) for o in (EAGER_OPS, ops)]
        torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)
        assert torch.equal(logits[1].argmax(-1), logits[0].argmax(-1))


def test_steps_the_graphs_do_not_hold_are_refused(tiny_model: LlamaModel) -> None:
    cache = tiny_model.allocate_kv_cache(NUM_BLOCKS + 1, BS)
    graphs = GraphDecoder(tiny_model, cache, max_batch=2, scratch_block=NUM_BLOCKS,
                          capture=False)
    one = StepItem([1], 3, [0], 1)
    assert graphs.fits([one, one]) and not graphs.fits([one] * 3)
    assert not graphs.fits([StepItem([1, 2], 3, [0], 2)])
    assert not graphs.fits([StepItem([1], 3, list(range(NUM_BLOCKS + 1)), 1)])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_captured_graph_replays_the_eager_steps_logits(tiny_model: LlamaModel) -> None:
    model = tiny_model.to("cuda")
    try:
        logits = []
        for capture, ops in ((False, EAGER_OPS), (True, EAGER_OPS), (True, fused_ops())):
            cache = model.allocate_kv_cache(NUM_BLOCKS + 1, BS)
            general = TorchBackend(model, cache)
            graphs = GraphDecoder(model, cache, max_batch=8, scratch_block=NUM_BLOCKS,
                                  capture=capture, ops=ops)
            items = _prefill(general, [9, 6, 17])
            logits.append(graphs.run(items).cpu())
            assert graphs.capture == capture
        torch.testing.assert_close(logits[0], logits[1])
        # Inductor's fused kernels: the same sums in another order.
        torch.testing.assert_close(logits[0], logits[2], rtol=1e-4, atol=1e-4)
    finally:
        tiny_model.to("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_decoder_is_chosen_among_graphs_fused_graphs_and_the_general_path(
        tiny_model: LlamaModel) -> None:
    from turboinfer.llm.backends.select import device_decoder

    model = tiny_model.to("cuda")
    try:
        cache = model.allocate_kv_cache(NUM_BLOCKS + 1, BS)
        general = TorchBackend(model, cache)
        _, choice = device_decoder(model, cache, general, backend="auto",
                                   scratch_block=NUM_BLOCKS, max_batch=8)
        assert choice is not None and not choice.forced
        assert set(choice.step_ms) | set(choice.unavailable) == {
            "graphs", "graphs_fused", "general"}
        assert choice.chosen == min(choice.step_ms, key=lambda k: choice.step_ms[k])
        assert set(choice.prepare_s) == set(choice.step_ms)
        forced, choice = device_decoder(model, cache, general, backend="graphs",
                                        scratch_block=NUM_BLOCKS, max_batch=8)
        assert forced is not None and choice is not None and choice.chosen != "general"
    finally:
        tiny_model.to("cpu")
