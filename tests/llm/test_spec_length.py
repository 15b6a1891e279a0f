"""How many tokens a draft proposes per round: measured round costs, counted agreement."""

from __future__ import annotations

import pytest

from turboinfer.llm import LLM, EngineConfig, SamplingParams, demo_model_dir
from turboinfer.llm.engine.spec_length import SpeculationLength, measure_round_costs

GREEDY = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def settled(length: SpeculationLength, accept: int, rounds: int = 200) -> list[int]:
    """Run ``rounds`` rounds in which the target keeps ``accept`` drafts (all it is given,
    if fewer); the k's chosen in the last 100."""
    chosen = []
    for _ in range(rounds):
        k = length.choose()
        length.record(k, min(k, accept))
        chosen.append(k)
    return chosen[-100:]


def test_cheap_extra_rows_and_a_draft_that_is_always_right_propose_the_most() -> None:
    length = SpeculationLength([0.9, 1.0, 1.02, 1.04, 1.06, 1.08, 1.10])
    chosen = settled(length, accept=6)
    assert max(set(chosen), key=chosen.count) == 6
    assert length.expected_tokens()[-1] > 6.5


def test_a_draft_that_is_right_once_stops_proposing_more() -> None:
    """Agreement ends after the first draft: more rows only cost."""
    length = SpeculationLength([0.8, 1.0, 1.3, 1.6, 1.9, 2.2, 2.5])
    chosen = settled(length, accept=1)
    assert max(set(chosen), key=chosen.count) == 1
    # The probes look one step either way now and then, never further.
    assert set(chosen) <= {0, 1, 2}
    assert length.acceptance()[0] > 0.9 and length.acceptance()[1] < 0.2


def test_a_draft_that_is_never_right_leaves_plain_steps() -> None:
    length = SpeculationLength([0.8, 1.0, 1.3, 1.6])
    chosen = settled(length, accept=0)
    assert chosen.count(0) > 80 and set(chosen) <= {0, 1}


def test_a_costly_step_in_the_round_costs_moves_k_below_it() -> None:
    """Rounds of 5 or more proposals cost twice as much (a second pass over the weights):
    with a draft that is always right, 4 yields 5 tokens for 1.2 where 6 yields 7 for 2.4."""
    length = SpeculationLength([0.9, 1.0, 1.05, 1.1, 1.2, 2.2, 2.4])
    chosen = settled(length, accept=6)
    assert max(set(chosen), key=chosen.count) == 4


def test_first_rounds_propose_the_most_and_probes_stay_in_range() -> None:
    length = SpeculationLength([0.8, 1.0, 1.3, 1.6, 1.9], warmup=4)
    for _ in range(4):
        assert length.choose() == 4
        length.record(4, 0)
    chosen = settled(length, accept=0, rounds=64)
    assert set(chosen) <= {0, 1}


def test_prompt_lookup_proposals_are_cut_where_more_rows_stop_paying() -> None:
    """Proposals of 6 whose first 3 tokens are kept: a round of 3 yields 4 tokens for
    1.1 ms, one of 6 the same 4 for 2.2; every 8th proposal verifies one token more than
    the choice (the position past it stays counted), not the whole proposal."""
    length = SpeculationLength([0.8, 0.9, 1.0, 1.1, 2.0, 2.1, 2.2], warmup=2)
    kept = []
    for _ in range(80):
        k = length.truncate(6)
        length.record(k, min(k, 3))
        kept.append(k)
    assert kept[:2] == [6, 6]
    assert kept[-16:].count(3) == 14 and kept[-16:].count(4) == 2
    assert length.truncate(2) <= 2


def test_round_costs_are_timed_per_k_and_never_fall_with_k() -> None:
    calls: list[tuple[str, int]] = []
    costs = measure_round_costs(lambda rows: calls.append(("verify", rows)),
                                lambda k: calls.append(("propose", k)), max_k=5, repeats=3)
    assert len(costs) == 6 and all(c > 0 for c in costs)
    assert costs == sorted(costs)
    # Each round is the verification of k + 1 rows, then the draft's k steps (none for
    # k = 0, a plain step); every k once untimed and three times timed.
    verified = [n for what, n in calls if what == "verify"]
    assert sorted(verified) == sorted(list(range(1, 7)) * 4)
    for i, (what, n) in enumerate(calls):
        if what == "propose":
            assert calls[i - 1] == ("verify", n + 1)
    assert sum(what == "propose" for what, _ in calls) == 5 * 4


def test_bad_costs_are_refused() -> None:
    with pytest.raises(ValueError, match="round costs"):
        SpeculationLength([1.0])
    with pytest.raises(ValueError, match="round costs"):
        SpeculationLength([1.0, 0.0])


@pytest.fixture(scope="module")
def demo_plain() -> LLM:
    return LLM(config=EngineConfig(kv_cache_tokens=2048))


def test_demo_draft_rounds_follow_the_measured_choice_and_stay_exact(demo_plain: LLM) -> None:
    spec = LLM(draft=demo_model_dir("draft"),
               config=EngineConfig(kv_cache_tokens=2048, num_speculative_tokens=5))
    length = spec.engine.spec_length
    if length is None:
        pytest.skip("the demo target does not run on the native step here")
    assert len(length.round_ms) == 6 and length.round_ms == sorted(length.round_ms)
    prompts = ["If the file does not exist,", "Return a new list containing"]
    for prompt in prompts:
        assert (spec.generate(prompt, GREEDY)[0].token_ids
                == demo_plain.generate(prompt, GREEDY)[0].token_ids)
    stats = spec.engine.spec_stats
    # Every round of these lone greedy requests went through the chooser.
    assert sum(length.rounds_by_k) == stats.target_forwards
    assert stats.drafted == sum(k * n for k, n in enumerate(length.rounds_by_k))
    assert set(length.to_dict()) == {"round_ms", "rounds_by_k", "expected_tokens"}


def test_a_fixed_k_is_kept_when_asked() -> None:
    spec = LLM(draft=demo_model_dir("draft"),
               config=EngineConfig(kv_cache_tokens=2048, num_speculative_tokens=3,
                                   adapt_speculative_tokens=False))
    assert spec.engine.spec_length is None
    spec.generate("Return a new list containing", GREEDY)
    stats = spec.engine.spec_stats
    # Every round proposed 3, but the last, cut by the token limit.
    assert stats.drafted >= 3 * (stats.target_forwards - 1)


def test_prompt_lookup_rounds_are_cut_by_the_measured_costs_and_stay_exact(
        demo_plain: LLM) -> None:
    lookup = LLM(ngram=3, config=EngineConfig(kv_cache_tokens=2048, num_speculative_tokens=8))
    length = lookup.engine.spec_length
    if length is None:
        pytest.skip("the demo target does not run on the native step here")
    assert len(length.round_ms) == 9
    text = "Return the value of the attribute. Return the value of the"
    assert (lookup.generate(text, GREEDY)[0].token_ids
            == demo_plain.generate(text, GREEDY)[0].token_ids)
    assert sum(length.rounds_by_k) == lookup.engine.spec_stats.target_forwards
