"""Drawing tokens by the inverse cumulative distribution: the index each uniform maps to,
tokens of zero weight never drawn, frequencies that follow the weights, and per-request
generators that reproduce."""

from __future__ import annotations

import torch

from turboinfer.llm.engine.sampler import draw, draw_one, sample_from_probs


def test_each_uniform_maps_to_the_interval_it_falls_in() -> None:
    weights = torch.tensor([[0.0, 0.2, 0.0, 0.3, 0.5, 0.0]])
    # Cumulative: 0 | 0.2 | 0.2 | 0.5 | 1.0 | 1.0.
    for u, want in ((0.0, 1), (0.19, 1), (0.2, 3), (0.49, 3), (0.5, 4), (0.999999, 4)):
        assert int(draw(weights, torch.tensor([u]))[0]) == want, u


def test_unnormalized_weights_scale_the_uniform() -> None:
    weights = torch.tensor([[2.0, 0.0, 6.0], [0.0, 0.0, 1.0]])
    assert draw(weights, torch.tensor([0.24, 0.0])).tolist() == [0, 2]
    assert draw(weights, torch.tensor([0.26, 0.9])).tolist() == [2, 2]


def test_a_token_without_weight_is_never_drawn_even_at_the_top_of_the_range() -> None:
    weights = torch.zeros(1, 50_000)
    weights[0, 123] = 1e-30    # a sum that rounds: u x total may reach the total
    weights[0, 7] = 1.0
    for u in (0.0, 0.5, 1.0 - 2**-24, 1.0):
        assert int(draw(weights, torch.tensor([u]))[0]) in (7, 123)


def test_frequencies_follow_the_weights() -> None:
    probs = torch.softmax(torch.randn(1, 40, generator=torch.Generator().manual_seed(3)), -1)
    gen = torch.Generator().manual_seed(0)
    draws = 40_000
    counts = torch.bincount(draw(probs.expand(draws, -1), torch.rand(draws, generator=gen)),
                            minlength=40).double()
    expected = probs[0].double() * draws
    # Each count within 5 standard deviations of a binomial count.
    assert bool(((counts - expected).abs() <= 5 * expected.sqrt() + 1).all())


def test_a_request_with_its_own_generator_draws_the_same_tokens_in_any_batch() -> None:
    probs = torch.softmax(torch.randn(3, 1000, generator=torch.Generator().manual_seed(1)), -1)

    def tokens(seed_row: int, batch_rows: list[int]) -> int:
        gens: list[torch.Generator | None] = [None] * len(batch_rows)
        gens[batch_rows.index(seed_row)] = torch.Generator().manual_seed(42)
        out = sample_from_probs(probs[batch_rows], gens, torch.Generator().manual_seed(7))
        return int(out[batch_rows.index(seed_row)])

    assert tokens(1, [1]) == tokens(1, [0, 1, 2]) == tokens(1, [2, 1])
    assert draw_one(probs[1], torch.Generator().manual_seed(42)) == tokens(1, [1])
