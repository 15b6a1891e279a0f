"""One request must never leave the engine broken for the next; prefix hashes; logprobs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from turboinfer.errors import InvalidInputError
from turboinfer.llm import LLM, EngineConfig, SamplingParams
from turboinfer.llm.engine.block_manager import chain_hash
from turboinfer.llm.engine.sequence import TokenLogprob

LONG = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
SHORT = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("ngram", [0, 2])
def test_a_sequence_that_outgrows_the_kv_cache_stops_at_length(tiny_llm_dir: Path,
                                                              ngram: int) -> None:
    llm = LLM(tiny_llm_dir, ngram=ngram, config=EngineConfig(kv_cache_tokens=64))
    out = llm.generate("the value of a list", LONG)[0]
    assert out.finish_reason == "length"
    assert len(out.prompt_token_ids) + len(out.token_ids) == 64
    assert not llm.engine.has_unfinished()
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks
    # The next call works, and gives what a fresh engine gives.
    again = llm.generate("return the string", SHORT)[0]
    fresh = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=64))
    assert again.token_ids == fresh.generate("return the string", SHORT)[0].token_ids


def test_sequences_competing_for_a_small_cache_all_finish(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=64))
    outs = llm.generate(["the value", "return the string", "a list of"], LONG)
    assert [o.finish_reason for o in outs] == ["length"] * 3
    assert all(len(o.prompt_token_ids) + len(o.token_ids) == 64 for o in outs)


def test_an_invalid_prompt_queues_nothing(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024))
    with pytest.raises(InvalidInputError, match="context holds"):
        llm.generate(["the value", "the " * 300], SHORT)
    assert not llm.engine.has_unfinished()
    assert llm.generate("a list", SHORT)[0].token_ids == \
        LLM(tiny_llm_dir).generate("a list", SHORT)[0].token_ids


def test_a_prompt_larger_than_the_kv_cache_is_refused_up_front(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=32))
    with pytest.raises(InvalidInputError, match="KV cache holds 32"):
        llm.generate("the " * 40, SHORT)
    assert not llm.engine.has_unfinished()


def test_a_stream_closed_early_frees_its_blocks(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024))
    pieces = llm.stream("the value of a list", LONG)
    next(pieces)
    pieces.close()
    assert not llm.engine.has_unfinished()
    assert llm.engine.block_manager.num_used_blocks == 0


def test_chain_hash_is_a_cryptographic_digest_of_parent_and_tokens() -> None:
    a = chain_hash(None, (1, 2, 3))
    assert isinstance(a, bytes) and len(a) == 32
    assert a == chain_hash(None, (1, 2, 3))
    assert a != chain_hash(None, (1, 2, 4))
    assert chain_hash(a, (5,)) != chain_hash(None, (5,))
    # Token ids are encoded at fixed width: (1, 23) and (12, 3) must not meet.
    assert chain_hash(None, (1, 23)) != chain_hash(None, (12, 3))


@pytest.mark.parametrize("ngram", [0, 2])
def test_logprobs_follow_the_model(tiny_llm_dir: Path, ngram: int) -> None:
    llm = LLM(tiny_llm_dir, ngram=ngram, config=EngineConfig(kv_cache_tokens=1024))
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=3)
    out = llm.generate("the value of a list", params)[0]
    seq_logprobs = _logprobs_of(llm, "the value of a list", params)
    assert len(seq_logprobs) == len(out.token_ids)
    for token, (lp, top) in zip(out.token_ids, seq_logprobs, strict=True):
        assert len(top) == 3 and top[0][0] == token  # greedy: the chosen is the likeliest
        assert lp == pytest.approx(top[0][1]) and lp <= 0
        assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)


def _logprobs_of(llm: LLM, prompt: str, params: SamplingParams) -> list[TokenLogprob]:
    seq = llm.engine.add_request(llm.tokenizer.encode(prompt), params)
    while not seq.is_finished:
        llm.engine.step()
    return seq.logprobs


def test_logprobs_match_a_full_forward(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024))
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=0)
    prompt = llm.tokenizer.encode("the value of a list")
    seq = llm.engine.add_request(prompt, params)
    while not seq.is_finished:
        llm.engine.step()
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_llm_dir)
    with torch.no_grad():
        logits = hf(torch.tensor([seq.token_ids])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)
    for i, (lp, top) in enumerate(seq.logprobs):
        pos = len(prompt) + i
        assert top == []
        assert lp == pytest.approx(float(expected[pos - 1, seq.token_ids[pos]]), abs=1e-3)
