"""A prompt chunk's row count gets its own measured kernel; the LM head does not."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from turboinfer.llm.backends.cpu.kernels import PREFILL_MIN_GAIN, SelectedLinear, select_kernels
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.loader import load_model


def test_decoder_layers_get_a_prefill_tier_and_the_lm_head_does_not(
        tiny_llama_dir: Path) -> None:
    model = load_model(tiny_llama_dir)
    weight = model.layers[0].mlp.down_proj.weight.detach().clone()
    choices = select_kernels(model, QuantMode.NONE, prefill_rows=128)
    rows = {(c.out_features, c.in_features): set() for c in choices}
    for c in choices:
        rows[(c.out_features, c.in_features)].add(c.rows)
    head = model.lm_head
    assert isinstance(head, SelectedLinear)
    assert head.kernel_for(10_000) is head.large    # no third tier
    down = model.layers[0].mlp.down_proj
    assert isinstance(down, SelectedLinear)
    assert rows[(down.out_features, down.in_features)] == {1, 16, 128}
    prefill_choice = next(c for c in choices if c.rows == 128
                          and (c.out_features, c.in_features) == (down.out_features,
                                                                  down.in_features))
    # Its own prompt-chunk kernel where that beats the many-rows one by enough.
    own = (prefill_choice.chosen != down.large.name
           and prefill_choice.timings_ms[prefill_choice.chosen]
           < PREFILL_MIN_GAIN * prefill_choice.timings_ms.get(down.large.name, float("inf")))
    assert down.prefill.name == (prefill_choice.chosen if own else down.large.name)
    # Row counts route to their tier: 1-4 small, up to 2 * 16 many, then prefill.
    assert down.kernel_for(4) is down.small and down.kernel_for(32) is down.large
    assert down.kernel_for(33) is down.prefill
    for n in (1, 16, 33, 130):
        x = torch.randn(n, down.in_features)
        torch.testing.assert_close(down(x), F.linear(x, weight), atol=1e-4, rtol=1e-4)


def test_no_prefill_tier_when_asked(tiny_llama_dir: Path) -> None:
    model = load_model(tiny_llama_dir)
    choices = select_kernels(model, QuantMode.NONE, prefill_rows=0, measure=False)
    assert {c.rows for c in choices} == {1, 16}
    down = model.layers[0].mlp.down_proj
    assert isinstance(down, SelectedLinear) and down.kernel_for(10_000) is down.large


def test_prompt_chunk_copies_stay_within_the_memory_budget(tiny_llama_dir: Path) -> None:
    model = load_model(tiny_llama_dir)
    x = torch.randn(130, model.config.hidden_size)
    expected = F.linear(x, model.layers[0].mlp.gate_up_proj.weight.detach())
    select_kernels(model, QuantMode.NONE, prefill_rows=128, prefill_budget_bytes=0)
    for layer in model.layers:
        for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                       layer.mlp.gate_up_proj, layer.mlp.down_proj):
            assert isinstance(linear, SelectedLinear)
            # No new copy: the chunk tier is the many-rows kernel or one already built.
            assert linear.prefill is linear.large or linear.prefill is linear.small
    gate_up = model.layers[0].mlp.gate_up_proj
    torch.testing.assert_close(gate_up(x), expected, rtol=1e-4, atol=1e-4)
