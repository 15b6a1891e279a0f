"""Expert offload: with a budget holding half of the experts, greedy output equals the
all-resident run and the cache and prefetch counters move."""

from __future__ import annotations

from pathlib import Path

import pytest
from llm_helpers import make_engine

from turboinfer.errors import ConfigError
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.experts import (
    GIB,
    CachePolicy,
    expert_cache,
    load_offloaded_model,
    moe_report,
)
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.loader import load_model
from turboinfer.llm.model.quant import quantize_model

PROMPTS = [[5, 17, 99, 3, 42, 7, 64, 1, 2, 88, 31], [9, 8, 7], [100, 1, 50, 2, 60, 3, 70],
           [11, 12]]
# One Qwen2-MoE test expert: gate/up [128, 64] + down [64, 64], fp32.
EXPERT_BYTES = (128 * 64 + 64 * 64) * 4


def run(model: LlamaModel, n: int = 12) -> list[list[int]]:
    engine = make_engine(model, kv_cache_tokens=512, block_size=4)
    seqs = [engine.add_request(p, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
            for p in PROMPTS]
    while engine.has_unfinished():
        engine.step()
    return [s.output_token_ids for s in seqs]


@pytest.mark.parametrize("policy", list(CachePolicy))
@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "no_prefetch"])
def test_half_the_experts_resident_gives_identical_output(qwen2_moe_dir: Path,
                                                          prefetch: bool,
                                                          policy: CachePolicy) -> None:
    expected = run(load_model(qwen2_moe_dir))
    total = 2 * 8                                       # 2 sparse layers x 8 experts
    budget_gb = (total // 2) * EXPERT_BYTES / GIB
    model = load_offloaded_model(qwen2_moe_dir, budget_gb, prefetch=prefetch, policy=policy)
    assert run(model) == expected
    cache = expert_cache(model)
    assert cache is not None
    stats = cache.stats
    assert len(cache) <= total // 2 and cache.resident_bytes <= cache.capacity
    assert stats.misses > 0 and stats.hits > 0
    assert stats.bytes_loaded >= stats.misses * EXPERT_BYTES
    if prefetch:
        assert stats.predicted > 0 and stats.prefetch_loads > 0
        assert 0 < stats.prefetch_accuracy <= 1 and stats.prefetch_used > 0
    else:
        assert stats.predicted == 0 and stats.prefetch_loads == 0
    report = moe_report(model, output_tokens=12 * len(PROMPTS))
    assert report is not None
    assert report["expert_cache"]["bytes_loaded_per_token"] > 0
    balance = report["load_balance"]
    assert [row["layer"] for row in balance] == [0, 1]
    # Every token of every forward picked top-2 experts in each layer.
    tokens = sum(len(p) for p in PROMPTS) + 11 * len(PROMPTS)
    assert all(sum(row["tokens_per_expert"]) == 2 * tokens for row in balance)


def test_a_budget_for_every_expert_loads_each_once(qwen2_moe_dir: Path) -> None:
    model = load_offloaded_model(qwen2_moe_dir, 1.0)
    run(model)
    cache = expert_cache(model)
    assert cache is not None
    assert cache.stats.evictions == 0
    assert cache.stats.bytes_loaded == len(cache) * EXPERT_BYTES


def test_offload_needs_an_moe_model(tiny_llama_dir: Path) -> None:
    with pytest.raises(ConfigError, match="mixture-of-experts"):
        load_offloaded_model(tiny_llama_dir, 1.0)


def test_layer_policy_keeps_layers_resident_where_lru_thrashes(qwen2_moe_dir: Path) -> None:
    """Two layers cycling through a cache that holds one layer's experts: LRU evicts
    each layer's experts just before they are needed again; the layer-aware policy keeps
    one layer resident, so it hits every time that layer runs."""
    budget_gb = 8 * EXPERT_BYTES / GIB
    rates = {}
    for policy in CachePolicy:
        model = load_offloaded_model(qwen2_moe_dir, budget_gb, prefetch=False, policy=policy)
        run(model)
        cache = expert_cache(model)
        assert cache is not None
        rates[policy] = cache.stats.hit_rate
    assert rates[CachePolicy.LAYER] > rates[CachePolicy.LRU]


def test_offloaded_experts_are_quantized_as_resident_ones(qwen2_moe_dir: Path) -> None:
    """int8 applies per expert on load, so half-resident int8 decodes as all-resident
    int8 does."""
    resident = load_model(qwen2_moe_dir)
    quantize_model(resident, QuantMode.INT8)
    model = load_offloaded_model(qwen2_moe_dir, 8 * EXPERT_BYTES / GIB, quant=QuantMode.INT8)
    quantize_model(model, QuantMode.INT8)          # the non-expert layers, as LLM does
    assert run(model) == run(resident)
    cache = expert_cache(model)
    assert cache is not None and cache.stats.misses > 0
    # int8 experts take a quarter of the fp32 bytes (plus per-channel scales).
    assert cache.resident_bytes < len(cache) * EXPERT_BYTES / 3
