"""The batched native decode step (llm/backends/cpu/batch_decode.py) against the runner's
general path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llm_helpers import save_random_hf_model

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.cpu import kernel_candidates
from turboinfer.llm.backends.cpu.batch_decode import BatchDecoder, supports_batch_decode
from turboinfer.llm.backends.cpu.kernels import select_kernels
from turboinfer.llm.backends.cpu.native import DISABLE_ENV, native_status
from turboinfer.llm.backends.runner import ModelRunner
from turboinfer.llm.engine.llm_engine import LLMEngine
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.model.attention import KVCache
from turboinfer.llm.model.config import EngineConfig, QuantMode
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.loader import load_model

PROMPTS = [[(7 * i + j) % 128 for j in range(5 + 3 * i)] for i in range(6)]
# Block tables out of order and interleaved between sequences (block size 4).
TABLES = [[9, 2, 17, 5, 30, 11], [0, 14, 3, 22, 8, 1], [25, 7, 19, 4, 12, 28],
          [6, 21, 13, 27, 10, 16]]


@pytest.fixture
def native() -> None:
    if native_status().library is None:
        pytest.skip(f"native kernels absent: {native_status().reason}")


def _runners(model: LlamaModel) -> tuple[ModelRunner, ModelRunner]:
    new = ModelRunner(model, model.allocate_kv_cache(32, 4))
    general = ModelRunner(model, model.allocate_kv_cache(32, 4))
    general.batch_decode = False
    return new, general


def _decode(model: LlamaModel, steps: int, atol: float) -> tuple[ModelRunner, ModelRunner]:
    """Prefill four prompts of different lengths on both runners, then decode greedily
    in batched steps; every step's logits close and its argmax equal."""
    new, general = _runners(model)
    prompts = PROMPTS[:4]
    items = [StepItem(p, 0, t, 1) for p, t in zip(prompts, TABLES, strict=True)]
    a, b = new.run(items), general.run(items)      # prompts: the general path on both
    assert torch.equal(a, b)
    tokens = [int(t) for t in a.argmax(-1)]
    starts = [len(p) for p in prompts]
    for _ in range(steps):
        step = [StepItem([tok], s, t, 1) for tok, s, t in zip(tokens, starts, TABLES,
                                                              strict=True)]
        a, b = new.run(step), general.run(step)
        assert a.shape == b.shape == (4, model.config.vocab_size) and a.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=1e-4, atol=atol)
        assert a.argmax(-1).tolist() == b.argmax(-1).tolist()
        tokens = [int(t) for t in a.argmax(-1)]
        starts = [s + 1 for s in starts]
    return new, general


def test_batch_step_matches_general_path(native: None, tiny_model: LlamaModel) -> None:
    """Scattered block tables, different lengths, steps crossing block boundaries: the
    same greedy ids, logits and cache contents up to float rounding."""
    new, general = _decode(tiny_model, 9, atol=1e-4)
    assert new._batch is not None and new.batch_decode
    assert general._batch is None
    torch.testing.assert_close(new.kv_cache.k, general.kv_cache.k, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(new.kv_cache.v, general.kv_cache.v, rtol=1e-4, atol=1e-5)
    # Slots no sequence reached stay untouched.
    used = {b for t in TABLES for b in t}
    unused = [b for b in range(32) if b not in used]
    assert not new.kv_cache.k[:, unused].any() and not new.kv_cache.v[:, unused].any()


def test_qkv_bias(native: None, tmp_path: Path) -> None:
    """A Qwen2-layout model (q/k/v projections with a bias) takes the batched step too."""
    model = load_model(save_random_hf_model(tmp_path, arch="qwen2"))
    assert model.layers[0].self_attn.qkv_proj.bias is not None
    new, _ = _decode(model, 5, atol=1e-4)
    assert new._batch is not None


def test_measured_int8_kernels(native: None, tiny_llama_dir: Path) -> None:
    """Layers on ``SelectedLinear`` kernels (int8, per row-count): the decoder runs the
    kernel the layer picks for the step's rows; logits stay close to the general path's."""
    model = load_model(tiny_llama_dir)
    select_kernels(model, QuantMode.INT8, measure=False)
    new, _ = _decode(model, 4, atol=2e-2)
    assert new._batch is not None
    layer = model.layers[0].self_attn.qkv_proj
    assert new._batch._kernels_for(4)[0][0][0] is layer.kernel_for(4)


def test_one_step_by_hand(native: None, tiny_model: LlamaModel) -> None:
    """``BatchDecoder.step`` itself: two sequences whose tables differ in length."""
    cache = tiny_model.allocate_kv_cache(16, 4)
    runner = ModelRunner(tiny_model, cache)
    runner.batch_decode = False
    tables = [[3, 7, 1], [12]]
    runner.run([StepItem(PROMPTS[4][:9], 0, tables[0], 1), StepItem([1, 2], 0, tables[1], 1)])
    before = (cache.k.clone(), cache.v.clone())
    want = runner.run([StepItem([5], 9, tables[0], 1), StepItem([6], 2, tables[1], 1)])
    after = (cache.k.clone(), cache.v.clone())
    cache.k.copy_(before[0])
    cache.v.copy_(before[1])
    library = native_status().library
    assert library is not None
    got = BatchDecoder(tiny_model, cache, library).step([5, 6], [9, 2], tables)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cache.k, after[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cache.v, after[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", [QuantMode.NONE, QuantMode.INT8, QuantMode.INT4,
                                  QuantMode.Q8])
def test_native_kernels_throughout_make_the_step_one_call(
        native: None, tiny_llama_dir: Path, monkeypatch: pytest.MonkeyPatch,
        mode: QuantMode) -> None:
    """Every layer on a native kernel: the whole step is one call into C, with the logits
    and cache writes of the loop from Python bit for bit (the same operations, kernels and
    order)."""
    monkeypatch.setattr(kernel_candidates, "_torch_candidates", lambda mode, group: [])
    model = load_model(tiny_llama_dir)
    select_kernels(model, mode, measure=False)
    cache = model.allocate_kv_cache(16, 4)
    runner = ModelRunner(model, cache)
    runner.batch_decode = False
    tables = [[3, 7, 1], [12], [5, 9]]
    runner.run([StepItem(PROMPTS[4][:9], 0, tables[0], 1), StepItem([1, 2], 0, tables[1], 1),
                StepItem(PROMPTS[2][:6], 0, tables[2], 1)])
    before = (cache.k.clone(), cache.v.clone())
    library = native_status().library
    assert library is not None
    decoder = BatchDecoder(model, cache, library)
    assert decoder._native_layers(3) is not None
    results = []
    for one_call in (True, False):
        cache.k.copy_(before[0])
        cache.v.copy_(before[1])
        decoder.native_steps = one_call
        logits = decoder.step([5, 6, 7], [9, 2, 6], tables)
        results.append((logits, cache.k.clone(), cache.v.clone()))
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
    # A layer without a native kernel for the step's rows: the loop from Python.
    model.layers[0].mlp.down_proj.small = lambda x: x  # type: ignore[assignment]
    assert BatchDecoder(model, cache, library)._native_layers(3) is None


def test_engine_requests_joining_and_finishing(native: None, tiny_model: LlamaModel) -> None:
    """Requests join while others decode and finish at different lengths: the greedy
    outputs equal an engine that never takes the batched native step."""
    outputs, forwards = [], []
    for batched in (True, False):
        engine = LLMEngine(tiny_model, EngineConfig(block_size=4, num_blocks=96))
        engine.runner.batch_decode = batched
        seqs = [engine.add_request(PROMPTS[i], SamplingParams(max_tokens=6 + 3 * i,
                                                              temperature=0.0,
                                                              ignore_eos=True))
                for i in range(3)]
        for _ in range(4):
            engine.step()
        params = SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True)
        seqs += [engine.add_request(PROMPTS[i], params) for i in (3, 4, 0)]
        while engine.has_unfinished():
            engine.step()
        outputs.append([s.output_token_ids for s in seqs])
        forwards.append(engine.runner._batch is not None)
    assert outputs[0] == outputs[1]
    assert [len(o) for o in outputs[0]] == [6, 9, 12, 7, 7, 7]
    assert outputs[0][0][:6] == outputs[0][5][:6]      # the same prompt, the same tokens
    assert forwards == [True, False]


def test_without_the_library_the_general_path_runs(tiny_model: LlamaModel,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DISABLE_ENV, "0")
    assert native_status().library is None
    new, general = _runners(tiny_model)
    items = [StepItem(PROMPTS[i], 0, TABLES[i], 1) for i in range(2)]
    new.run(items)
    general.run(items)
    step = [StepItem([3], len(PROMPTS[0]), TABLES[0], 1),
            StepItem([4], len(PROMPTS[1]), TABLES[1], 1)]
    assert torch.equal(new.run(step), general.run(step))    # bit for bit: the same path
    assert not new.batch_decode and new._batch is None
    assert torch.equal(new.kv_cache.k, general.kv_cache.k)


def test_only_float32_dense_models(tiny_model: LlamaModel) -> None:
    cache = tiny_model.allocate_kv_cache(8, 4)
    assert supports_batch_decode(tiny_model, cache)
    c = tiny_model.config
    half = KVCache.allocate(num_layers=c.num_hidden_layers, num_blocks=8, block_size=4,
                            num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
                            dtype=torch.bfloat16)
    assert not supports_batch_decode(tiny_model, half)
