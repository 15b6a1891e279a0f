"""Speculative decoding of the shipped demo model on the repetitive workload (the prompt
holds the model's earlier answer): draft and prompt lookup give plain greedy's tokens."""

from __future__ import annotations

import pytest

from turboinfer.llm import LLM, EngineConfig, SamplingParams, demo_model_dir

GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
CONFIG = EngineConfig(kv_cache_tokens=2048, num_speculative_tokens=6)


@pytest.fixture(scope="module")
def plain() -> LLM:
    return LLM(config=CONFIG)


def regenerate_prompt(llm: LLM, line: str) -> list[int]:
    """``X Y "\\n\\n" X``: the line, the model's answer to it, and the line again."""
    x = llm.tokenizer.encode(line)
    y = list(llm.generate(x, GREEDY)[0].token_ids)
    return x + y + llm.tokenizer.encode("\n\n") + x


@pytest.mark.slow
def test_draft_and_prompt_lookup_are_exact_on_the_repetitive_workload(plain: LLM) -> None:
    prompts = [regenerate_prompt(plain, line) for line in
               ("Write an XML element to a file-like object",
                "Returns the value of the specified attribute.")]
    expected = [plain.generate(p, GREEDY)[0].token_ids for p in prompts]
    ngram = LLM(ngram=3, config=CONFIG)
    draft = LLM(draft=demo_model_dir("draft"), config=CONFIG)
    for llm in (ngram, draft):
        assert [llm.generate(p, GREEDY)[0].token_ids for p in prompts] == expected
    # The lookup found the earlier answer in the prompt and the target kept some of it.
    assert ngram.engine.spec_stats.accepted > 0
    assert draft.engine.spec_stats.accepted > 0
