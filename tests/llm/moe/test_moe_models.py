"""Mixtral and Qwen2-MoE folders load and generate exactly as ``transformers`` does; the
expert layer runs grouped (one call per active expert); quantization applies per expert."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from llm_helpers import hf_greedy, make_engine
from moe_helpers import save_random_moe_model

from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.loader import load_model
from turboinfer.llm.model.moe import ExpertMLP, Gate, SparseMoeBlock, moe_blocks
from turboinfer.llm.model.quant import Int4Linear, Int8Linear, quantize_model

PROMPTS = [[5, 17, 99, 3, 42, 7, 64, 1, 2, 88, 31], [9, 8, 7], [100, 1, 50, 2, 60, 3, 70]]


def engine_greedy(folder: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """All prompts batched together through the paged engine."""
    engine = make_engine(load_model(folder), kv_cache_tokens=512, block_size=4)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=n, temperature=0,
                                                 ignore_eos=True)) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    return [s.output_token_ids for s in seqs]


def test_mixtral_greedy_matches_transformers(mixtral_dir: Path) -> None:
    expected = [hf_greedy(mixtral_dir, p, 16) for p in PROMPTS]
    assert engine_greedy(mixtral_dir, PROMPTS, 16) == expected


@pytest.mark.parametrize("overrides", [
    {},                                                  # norm_topk_prob False (default)
    {"norm_topk_prob": True, "mlp_only_layers": [1]},    # renormalised; layer 1 dense
], ids=["default", "norm_topk_dense_layer"])
def test_qwen2_moe_greedy_matches_transformers(tmp_path: Path,
                                               overrides: dict[str, object]) -> None:
    folder = save_random_moe_model(tmp_path / "q", "qwen2_moe", **overrides)
    model = load_model(folder)
    assert len(moe_blocks(model)) == (1 if overrides else 2)
    expected = [hf_greedy(folder, p, 16) for p in PROMPTS]
    assert engine_greedy(folder, PROMPTS, 16) == expected


def test_logits_match_transformers(qwen2_moe_dir: Path) -> None:
    import transformers  # why: reference implementation, heavy import

    hf = transformers.AutoModelForCausalLM.from_pretrained(qwen2_moe_dir).eval()
    ours = load_model(qwen2_moe_dir)
    ids = torch.tensor(PROMPTS[0])
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
        got = ours.logits(ours(ids, torch.arange(len(ids))))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_experts_run_grouped_once_per_active_expert(qwen2_moe_dir: Path) -> None:
    """A 40-token forward calls each routed expert at most once per layer (all of its
    tokens in one matmul), and every (token, expert) pair is counted."""
    model = load_model(qwen2_moe_dir)
    calls: list[int] = []
    for block in moe_blocks(model):
        for module in block.experts.fetch(list(range(block.num_experts))).values():
            module.register_forward_hook(lambda _m, args, _o: calls.append(args[0].shape[0]))
    ids = torch.randint(0, 128, (40,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids, torch.arange(40))
    blocks = moe_blocks(model)
    assert len(calls) <= sum(b.num_experts for b in blocks)
    assert sum(calls) == 40 * 2 * len(blocks)                 # top-2, every pair once
    for block in blocks:
        assert int(block.tokens_per_expert.sum()) == 40 * 2


@pytest.mark.parametrize("mode, cls", [(QuantMode.INT8, Int8Linear), (QuantMode.INT4, Int4Linear)])
def test_quantization_applies_per_expert(mixtral_dir: Path, mode: QuantMode,
                                         cls: type[torch.nn.Module]) -> None:
    reference = load_model(mixtral_dir)
    model = load_model(mixtral_dir)
    quantize_model(model, mode, group_size=32)
    block: SparseMoeBlock = moe_blocks(model)[0]
    experts = block.experts.fetch(list(range(block.num_experts)))
    for expert in experts.values():
        assert isinstance(expert, ExpertMLP)
        assert isinstance(expert.gate_up_proj, cls) and isinstance(expert.down_proj, cls)
    # The router stays in float: quantizing it could send tokens to other experts.
    assert isinstance(block.gate, Gate)
    assert block.gate.weight.dtype == torch.float32
    # Each expert computes what its float weights do, within the format's rounding.
    originals = moe_blocks(reference)[0].experts.fetch(list(range(block.num_experts)))
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(0))
    tolerance = 0.03 if mode is QuantMode.INT8 else 0.2
    with torch.no_grad():
        for e, expert in experts.items():
            want, got = originals[e](x), expert(x)
            assert not torch.equal(got, want)
            assert float((got - want).norm() / want.norm()) < tolerance
