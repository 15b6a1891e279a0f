"""The shipped demo model and draft: load, write text, and speculate with identical output."""

from __future__ import annotations

import pytest

from turboinfer.llm import LLM, EngineConfig, SamplingParams, demo_model_dir

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def demo() -> LLM:
    return LLM(config=EngineConfig(kv_cache_tokens=2048))


def test_demo_writes_words(demo: LLM) -> None:
    text = demo.generate("Return the number of", GREEDY)[0].text
    words = text.split()
    assert len(words) >= 8
    # Real text: mostly alphabetic words, not byte soup.
    assert sum(w.strip(".,:;()'\"`").isalpha() for w in words) >= len(words) // 2


def test_demo_draft_speculation_is_exact(demo: LLM) -> None:
    spec = LLM(draft=demo_model_dir("draft"),
               config=EngineConfig(kv_cache_tokens=2048, num_speculative_tokens=4))
    prompt = "If the file does not exist,"
    assert spec.generate(prompt, GREEDY)[0].token_ids == demo.generate(prompt, GREEDY)[0].token_ids
    assert spec.engine.spec_stats.acceptance_rate > 0.2
