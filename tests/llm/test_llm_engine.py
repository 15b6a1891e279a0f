"""Continuous batching, chunked prefill, prefix caching, preemption, priorities."""

from __future__ import annotations

from pathlib import Path

import pytest
from llm_helpers import make_engine

from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.llm.engine.llm_engine import LLMEngine
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.engine.sequence import FinishReason, Sequence
from turboinfer.llm.model.config import EngineConfig
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.loader import load_model

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
PROMPTS = [[(7 * i + j) % 128 for j in range(5 + 3 * i)] for i in range(6)]


def run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams = GREEDY,
        priorities: list[int] | None = None) -> list[Sequence]:
    seqs = [engine.add_request(p, params, priority=(priorities or [0] * len(prompts))[i])
            for i, p in enumerate(prompts)]
    while engine.has_unfinished():
        engine.step()
    return seqs


def alone(model: LlamaModel, prompt: list[int]) -> list[int]:
    return run(make_engine(model, kv_cache_tokens=256, block_size=4), [prompt])[0].output_token_ids


def test_batched_equals_one_at_a_time(tiny_model: LlamaModel) -> None:
    engine = make_engine(tiny_model, kv_cache_tokens=1024, block_size=4)
    batched = run(engine, PROMPTS)
    for prompt, seq in zip(PROMPTS, batched, strict=True):
        assert seq.output_token_ids == alone(tiny_model, prompt)
        assert seq.finish_reason is FinishReason.LENGTH
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_chunked_prefill_keeps_decodes_running(tiny_model: LlamaModel) -> None:
    engine = make_engine(tiny_model, kv_cache_tokens=1024, block_size=4,
                         max_num_batched_tokens=8)
    short = engine.add_request(PROMPTS[0], GREEDY)
    engine.step()  # short prompt prefilled, first token out
    long_prompt = [(3 * j) % 128 for j in range(40)]
    long = engine.add_request(long_prompt, GREEDY)
    steps_while_prefilling = 0
    while long.num_output_tokens == 0:
        before = short.num_output_tokens
        engine.step()
        steps_while_prefilling += 1
        assert short.is_finished or short.num_output_tokens == before + 1
    assert steps_while_prefilling >= 5  # 40 tokens in chunks of at most 7
    while engine.has_unfinished():
        engine.step()
    assert long.output_token_ids == alone(tiny_model, long_prompt)
    assert short.output_token_ids == alone(tiny_model, PROMPTS[0])


def test_prefix_cache_hit_reuses_blocks_and_output(tiny_model: LlamaModel) -> None:
    engine = make_engine(tiny_model, kv_cache_tokens=512, block_size=4)
    prefix = [(5 * j + 1) % 128 for j in range(20)]
    first = run(engine, [[*prefix, 1, 2]])[0]
    hits = engine.block_manager.prefix_hits
    second = engine.add_request([*prefix, 9, 9], GREEDY)
    engine.step()
    assert second.num_cached_tokens == 20
    assert engine.block_manager.prefix_hits == hits + 5
    while engine.has_unfinished():
        engine.step()
    assert second.output_token_ids == alone(tiny_model, [*prefix, 9, 9])
    assert first.output_token_ids == alone(tiny_model, [*prefix, 1, 2])


def test_preempted_sequences_resume_identically_and_nothing_leaks(
        tiny_model: LlamaModel) -> None:
    # 12 blocks of 4 tokens cannot hold six growing sequences at once.
    engine = make_engine(tiny_model, num_blocks=12, block_size=4)
    seqs = run(engine, PROMPTS)
    assert engine.scheduler.num_preemptions > 0
    assert any(s.num_preemptions for s in seqs)
    for prompt, seq in zip(PROMPTS, seqs, strict=True):
        assert seq.output_token_ids == alone(tiny_model, prompt)
    assert engine.block_manager.num_free_blocks == 12
    assert all(b.ref_count == 0 for b in engine.block_manager.blocks)


def test_abort_frees_blocks(tiny_model: LlamaModel) -> None:
    engine = make_engine(tiny_model, kv_cache_tokens=256, block_size=4)
    a = engine.add_request(PROMPTS[3], GREEDY, request_id="a")
    b = engine.add_request(PROMPTS[4], GREEDY, request_id="b")
    engine.step()
    engine.abort("a")
    assert a.finish_reason is FinishReason.ABORT
    while engine.has_unfinished():
        engine.step()
    assert b.finish_reason is FinishReason.LENGTH
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_priority_orders_admission_and_preempts_lower(tiny_model: LlamaModel) -> None:
    engine = make_engine(tiny_model, kv_cache_tokens=256, block_size=4, max_num_seqs=1)
    low = engine.add_request(PROMPTS[1], GREEDY, priority=5)
    engine.step()
    high = engine.add_request(PROMPTS[2], GREEDY, priority=0)
    engine.step()
    # The running low-priority request made room for the high-priority one.
    assert high in engine.scheduler.running and low in engine.scheduler.waiting
    while engine.has_unfinished():
        engine.step()
    assert high.token_times[-1] < low.token_times[-1]
    assert low.output_token_ids == alone(tiny_model, PROMPTS[1])


def test_stop_token_and_max_tokens(tiny_model: LlamaModel) -> None:
    expected = alone(tiny_model, PROMPTS[2])
    engine = make_engine(tiny_model, kv_cache_tokens=256, block_size=4)
    params = SamplingParams(max_tokens=12, temperature=0, stop_token_ids=(expected[3],))
    seq = run(engine, [PROMPTS[2]], params)[0]
    stop_at = expected.index(expected[3])
    assert seq.output_token_ids == expected[:stop_at + 1]
    assert seq.finish_reason is FinishReason.STOP


def test_seeded_sampling_is_reproducible_across_batches(tiny_model: LlamaModel) -> None:
    params = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, top_k=20, seed=7)
    a = run(make_engine(tiny_model), [PROMPTS[0]], params)[0].output_token_ids
    b = run(make_engine(tiny_model), [PROMPTS[0], PROMPTS[1]], params)[0].output_token_ids
    assert a == b


@pytest.mark.parametrize(("prompt", "message"), [
    ([], "prompt is empty"),
    (list(range(100)) * 3, "the context holds 256"),
    ([500], "prompt token ids"),
])
def test_bad_prompts(tiny_model: LlamaModel, prompt: list[int], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        make_engine(tiny_model).add_request(prompt, GREEDY)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_tokens": 0}, "max_tokens must be >= 1"),
    ({"temperature": -0.5}, "temperature must be >= 0"),
    ({"top_p": 0.0}, "top_p"),
])
def test_bad_sampling_params(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("batch_hint", [0, 16])
def test_fast_linears_give_identical_greedy_output(tiny_llama_dir: Path, batch_hint: int) -> None:
    from turboinfer.llm.backends.cpu.kernels import FastLinear, pack_linear_layers

    model = load_model(tiny_llama_dir)
    assert pack_linear_layers(model, batch_hint) == 2 * 4 + 1
    assert all(isinstance(m, FastLinear) for m in (model.lm_head, model.layers[0].mlp.down_proj))
    engine = make_engine(model, kv_cache_tokens=1024, block_size=4)
    fast = run(engine, PROMPTS[:3])
    plain = make_engine(load_model(tiny_llama_dir), kv_cache_tokens=1024, block_size=4)
    assert [s.output_token_ids for s in fast] == [
        s.output_token_ids for s in run(plain, PROMPTS[:3])]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"num_speculative_tokens": 0}, "num_speculative_tokens must be >= 1"),
    ({"speculative_max_batch": 0}, "speculative_max_batch must be >= 1"),
    ({"quant_group_size": 48}, "quant_group_size must be"),
])
def test_bad_engine_config(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EngineConfig(**kwargs)  # type: ignore[arg-type]
