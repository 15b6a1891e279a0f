"""Speculative decoding: exact greedy output, exact distribution, inside batching."""

from __future__ import annotations

import random

import torch
from llm_helpers import make_engine
from test_llm_engine import GREEDY, PROMPTS, alone, run

from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.engine.speculative import (
    NgramProposer,
    Proposal,
    TokenIndex,
    rejection_sample,
)
from turboinfer.llm.model.llama import LlamaModel


def test_draft_model_greedy_equals_plain_greedy(tiny_model: LlamaModel,
                                                tiny_draft: LlamaModel) -> None:
    engine = make_engine(tiny_model, kv_cache_tokens=1024, block_size=4, draft=tiny_draft,
                         num_speculative_tokens=3)
    seqs = run(engine, PROMPTS)
    for prompt, seq in zip(PROMPTS, seqs, strict=True):
        assert seq.output_token_ids == alone(tiny_model, prompt)
    stats = engine.spec_stats
    assert stats.drafted > 0 and 0 <= stats.acceptance_rate <= 1
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_speculation_pauses_while_the_batch_is_large(tiny_model: LlamaModel,
                                                     tiny_draft: LlamaModel) -> None:
    engine = make_engine(tiny_model, kv_cache_tokens=1024, block_size=4, draft=tiny_draft,
                         num_speculative_tokens=3, speculative_max_batch=2)
    assert engine.proposer is not None
    proposer, batch_sizes = engine.proposer, []
    propose = proposer.propose

    def observed(seqs, limits):  # type: ignore[no-untyped-def]
        batch_sizes.append(len(seqs))
        return propose(seqs, limits)

    proposer.propose = observed  # type: ignore[method-assign]
    # Different lengths: the batch shrinks as requests finish, so both modes run and the
    # draft has to catch up on the tokens decoded plainly.
    params = [SamplingParams(max_tokens=3 + 3 * i, temperature=0, ignore_eos=True)
              for i in range(4)]
    seqs = [engine.add_request(p, sp) for p, sp in zip(PROMPTS[:4], params, strict=True)]
    while engine.has_unfinished():
        engine.step()
    assert batch_sizes and max(batch_sizes) <= 2
    for prompt, sp, seq in zip(PROMPTS[:4], params, seqs, strict=True):
        assert seq.output_token_ids == alone(tiny_model, prompt)[:sp.max_tokens]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_target_as_its_own_draft_accepts_everything(tiny_model: LlamaModel) -> None:
    engine = make_engine(tiny_model, kv_cache_tokens=512, block_size=4, draft=tiny_model,
                         num_speculative_tokens=4)
    seq = run(engine, [PROMPTS[2]])[0]
    assert seq.output_token_ids == alone(tiny_model, PROMPTS[2])
    assert engine.spec_stats.acceptance_rate == 1.0
    # 11 tokens after the prefill: 5 + 5 + 1 (the last round is cut by max_tokens).
    assert engine.spec_stats.tokens_per_forward == 11 / 3


def test_ngram_greedy_equals_plain_greedy_with_preemption(tiny_model: LlamaModel) -> None:
    repetitive = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3], *PROMPTS[:4]]
    engine = make_engine(tiny_model, num_blocks=14, block_size=4, ngram_size=3,
                         num_speculative_tokens=3)
    seqs = run(engine, repetitive)
    for prompt, seq in zip(repetitive, seqs, strict=True):
        assert seq.output_token_ids == alone(tiny_model, prompt)
    assert engine.spec_stats.drafted > 0
    assert engine.block_manager.num_free_blocks == 14


def test_ngram_lookup_proposes_the_continuation() -> None:
    proposer = NgramProposer(max_ngram=3, num_tokens=3)
    assert proposer._lookup([7, 8, 9, 1, 2, 7, 8], 3) == ([9, 1, 2], 2)
    assert proposer._lookup([3, 8, 9, 1, 2, 7, 8], 3) == ([9, 1, 2], 1)
    assert proposer._lookup([1, 2, 3], 3) == ([], 0)


def test_the_token_index_finds_what_the_scan_finds() -> None:
    """A sequence growing token by token over a small vocabulary (many repeats, matches
    of every length): the index's answer is the backward scan's at every length."""
    gen = random.Random(0)
    for max_ngram in (1, 2, 3, 5):
        proposer = NgramProposer(max_ngram=max_ngram, num_tokens=6)
        tokens: list[int] = []
        index = TokenIndex()
        for _ in range(400):
            tokens.append(gen.randrange(6) if gen.random() < 0.7 else gen.randrange(40))
            assert (proposer._lookup(tokens, 6, index.update(tokens))
                    == proposer._lookup(tokens, 6))
    # A sequence that got shorter is indexed again.
    assert index.update([9, 9]).positions == {9: [0, 1]}


def test_rejection_sampling_preserves_target_distribution() -> None:
    """Draft q and target p over 5 tokens; the first emitted token must follow p."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([0.05, 0.4, 0.1, 0.25, 0.2])
    q = torch.tensor([0.3, 0.1, 0.3, 0.1, 0.2])
    trials = 8000
    counts = torch.zeros(5)
    draws = torch.multinomial(q, trials, replacement=True, generator=gen)
    target = torch.stack([p, p])
    for d in draws.tolist():
        first = rejection_sample(target, Proposal([d], q[None, :]), gen)[0]
        counts[first] += 1
    expected = p * trials
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 18.5  # p = 0.001 for 4 degrees of freedom
    # A draft equal to the target is always accepted.
    for _ in range(50):
        assert rejection_sample(target, Proposal([1], p[None, :]), gen)[0] == 1


def test_rejection_sampling_with_deterministic_draft() -> None:
    gen = torch.Generator().manual_seed(1)
    p = torch.tensor([0.5, 0.3, 0.2])
    counts = torch.zeros(3)
    for _ in range(6000):
        counts[rejection_sample(torch.stack([p, p]), Proposal([2], None), gen)[0]] += 1
    expected = p * 6000
    assert float(((counts - expected) ** 2 / expected).sum()) < 13.8  # p = 0.001, 2 dof


def test_greedy_probs_accept_only_the_argmax() -> None:
    onehot = torch.eye(4)
    target = torch.stack([onehot[2], onehot[3], onehot[1]])
    assert rejection_sample(target, Proposal([2, 0], None)) == [2, 3]
    assert rejection_sample(target, Proposal([2, 3], None)) == [2, 3, 1]
    assert rejection_sample(target, Proposal([1, 3], None)) == [2]
    assert GREEDY.greedy


def test_greedy_accept_equals_rejection_sampling_on_one_hot() -> None:
    from turboinfer.llm.engine.speculative import greedy_accept

    onehot = torch.eye(6)
    for target, draft in [([2, 3, 1], [2, 0]), ([2, 3, 1], [2, 3]), ([4, 4, 4], [1, 4])]:
        probs = torch.stack([onehot[t] for t in target])
        assert greedy_accept(target, draft) == rejection_sample(probs, Proposal(draft, None))


def test_sampled_requests_mixed_with_greedy_in_one_speculative_batch(
        tiny_model: LlamaModel, tiny_draft: LlamaModel) -> None:
    from turboinfer.llm.engine.sampling_params import SamplingParams

    engine = make_engine(tiny_model, kv_cache_tokens=1024, block_size=4, draft=tiny_draft,
                         num_speculative_tokens=3)
    sampled = SamplingParams(max_tokens=12, temperature=0.8, top_k=30, seed=3, ignore_eos=True)
    a = engine.add_request(PROMPTS[0], sampled)
    b = engine.add_request(PROMPTS[1], GREEDY)
    while engine.has_unfinished():
        engine.step()
    assert a.num_output_tokens == 12 and b.num_output_tokens == 12
    assert b.output_token_ids == alone(tiny_model, PROMPTS[1])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_single_sequence_decoder_equals_the_runner(tiny_model: LlamaModel) -> None:
    """The lean draft path computes what the runner's packed path computes: the same
    greedy tokens, and the same keys and values in the same cache slots."""
    from turboinfer.llm.backends.base import StepItem
    from turboinfer.llm.backends.runner import ModelRunner
    from turboinfer.llm.backends.torch.lean_decode import SingleSequenceDecoder

    block_size, table = 4, [3, 0, 5, 1, 4]  # scattered blocks, as the allocator leaves them
    runner = ModelRunner(tiny_model, tiny_model.allocate_kv_cache(6, block_size))
    lean_cache = tiny_model.allocate_kv_cache(6, block_size)
    lean = SingleSequenceDecoder(tiny_model, lean_cache)
    prompt = PROMPTS[3]
    expected, feed, start = [], prompt, 0
    for _ in range(5):
        logits = runner.run([StepItem(feed, start, table, 1)])
        start += len(feed)
        feed = [int(logits[0].argmax())]
        expected.append(feed[0])
    # Prompt as the catch-up, then proposals in two calls (as consecutive rounds do).
    got = lean.greedy(prompt, 0, table, 3)
    got += lean.greedy(got[-1:], len(prompt) + 2, table, 2)
    assert got == expected
    written = [table[p // block_size] * block_size + p % block_size
               for p in range(len(prompt) + 4)]
    for ours, theirs in ((lean_cache.k, runner.kv_cache.k), (lean_cache.v, runner.kv_cache.v)):
        flat_ours = ours.flatten(1, 2)[:, written]
        flat_theirs = theirs.flatten(1, 2)[:, written]
        assert torch.allclose(flat_ours, flat_theirs, atol=1e-5)


def test_ngram_proposals_grow_with_the_match_and_while_copying() -> None:
    """A match of n tokens proposes n(n + 1) / 2; a proposal accepted whole doubles the
    next; a rejection leaves the match alone to decide, never under min_tokens."""
    from turboinfer.llm.engine.sequence import Sequence

    seq = Sequence([*range(1, 19), 1, 2], GREEDY)
    proposer = NgramProposer(max_ngram=3, num_tokens=8, min_tokens=2)
    limits = [100]
    first = proposer.propose([seq], limits)[0].tokens
    assert first == [3, 4, 5]  # "1 2" matched: 3 tokens
    for token in [*first, 6]:  # all accepted, plus the target's token
        seq.append_token(token)
    second = proposer.propose([seq], limits)[0].tokens
    assert second == [7, 8, 9, 10, 11, 12]  # "4 5 6" matched, and twice 3
    for token in [7, 8, 99]:  # rejected at the third
        seq.append_token(token)
    assert proposer.propose([seq], limits)[0].tokens == []  # 8, 99 never seen
    seq.append_token(1)
    assert proposer.propose([seq], limits)[0].tokens == [2, 3]  # "1" matched: min_tokens
    for token in [2, 3, 4]:
        seq.append_token(token)
    # "2 3 4" matched (6 tokens), but the request has room for 3 more.
    assert proposer.propose([seq], [3])[0].tokens == [5, 6, 7]
