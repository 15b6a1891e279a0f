"""The lean batch-1 decode step (llm/backends/torch/lean_decode.py) against the runner's
general path."""

from __future__ import annotations

import pytest
import torch

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.runner import ModelRunner
from turboinfer.llm.engine.llm_engine import LLMEngine
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.model.config import EngineConfig
from turboinfer.llm.model.llama import LlamaModel

PROMPTS = [[(7 * i + j) % 128 for j in range(5 + 3 * i)] for i in range(6)]


@pytest.mark.parametrize("table", [[0, 1, 2, 3, 4, 5], [3, 0, 5, 1, 4, 2]],
                         ids=["consecutive", "scattered"])
def test_lean_step_matches_general_path(tiny_model: LlamaModel, table: list[int]) -> None:
    """Same greedy ids, logits and cache contents, bit for bit, whether attention reads
    the blocks as one view (consecutive) or gathers them (scattered)."""
    block_size = 4
    lean = ModelRunner(tiny_model, tiny_model.allocate_kv_cache(6, block_size))
    general = ModelRunner(tiny_model, tiny_model.allocate_kv_cache(6, block_size),
                          lean_decode=False)
    prompt = PROMPTS[3]
    ids: list[list[int]] = [[], []]
    for which, runner in enumerate((lean, general)):
        feed, start = prompt, 0
        for _ in range(8):
            logits = runner.run([StepItem(feed, start, table, 1)])
            start += len(feed)
            feed = [int(logits[0].argmax())]
            ids[which].append(feed[0])
    assert ids[0] == ids[1]
    assert lean.lean_decode and not general.lean_decode
    assert lean._lean is not None and general._lean is None
    assert torch.equal(lean.kv_cache.k, general.kv_cache.k)
    assert torch.equal(lean.kv_cache.v, general.kv_cache.v)
    # One more step from the same caches: the logits themselves agree.
    step = [StepItem([ids[0][-1]], len(prompt) + 7, table, 1)]
    a, b = lean.run(step), general.run(step)
    assert a.shape == b.shape == (1, tiny_model.config.vocab_size)
    assert torch.equal(a, b)


def test_engine_batch_one_then_batched_steps_agree(tiny_model: LlamaModel) -> None:
    """A lone request decodes lean; a second joins (general batched steps over the cache
    the lean steps wrote) and a third reuses the first's cached prompt: greedy outputs
    equal an engine that never takes the lean path."""
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outputs = []
    for lean in (True, False):
        engine = LLMEngine(tiny_model, EngineConfig(block_size=4, num_blocks=64))
        engine.runner.lean_decode = lean
        first = engine.add_request(PROMPTS[0], params)
        for _ in range(5):
            engine.step()
        second = engine.add_request(PROMPTS[1], params)
        while engine.has_unfinished():
            engine.step()
        third = engine.add_request(PROMPTS[0], params)
        while engine.has_unfinished():
            engine.step()
        outputs.append([s.output_token_ids for s in (first, second, third)])
    assert outputs[0] == outputs[1]
    assert outputs[0][0] == outputs[0][2]
