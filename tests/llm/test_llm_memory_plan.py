"""The engine's memory plan: block counts, bytes, and refusing what cannot fit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from turboinfer.errors import InvalidInputError
from turboinfer.llm import LLM, EngineConfig, SamplingParams
from turboinfer.llm.engine.memory_plan import kv_block_bytes, module_bytes, plan_memory
from turboinfer.llm.model.llama import LlamaModel


def _per_block(model: LlamaModel, block_size: int) -> int:
    c = model.config
    return 2 * c.num_hidden_layers * block_size * c.num_key_value_heads * c.head_dim * 4


def test_the_cpu_plan_is_the_asked_size_with_its_bytes(tiny_model: LlamaModel) -> None:
    plan = plan_memory(tiny_model, EngineConfig(num_blocks=3, block_size=4))
    assert (plan.num_blocks, plan.block_size, plan.max_tokens) == (3, 4, 12)
    assert plan.kv_bytes_per_block == _per_block(tiny_model, 4)
    assert plan.kv_bytes == 3 * _per_block(tiny_model, 4)
    params = sum(p.numel() * p.element_size() for p in tiny_model.parameters())
    assert plan.weights_bytes >= params and plan.source == "blocks"
    default = plan_memory(tiny_model, EngineConfig())
    assert default.max_tokens == 16384 and default.source == "cpu default"


def test_a_plan_from_free_memory_takes_its_share_less_the_activations(
        tiny_model: LlamaModel) -> None:
    per_block = kv_block_bytes(tiny_model.config, 16, torch.float32)
    free = 1000 * per_block
    plan = plan_memory(tiny_model, EngineConfig(gpu_memory_utilization=0.5),
                       free_bytes=free, activation_bytes=100 * per_block)
    assert plan.num_blocks == 400 and plan.source == "free device memory"
    assert plan.max_tokens == 400 * 16 and plan.free_bytes_after_weights == free
    with pytest.raises(InvalidInputError, match="no room for the KV cache"):
        plan_memory(tiny_model, EngineConfig(), free_bytes=per_block,
                    activation_bytes=per_block)


def test_a_draft_shares_the_blocks_and_adds_its_bytes(tiny_model: LlamaModel,
                                                     tiny_draft: LlamaModel) -> None:
    alone = plan_memory(tiny_model, EngineConfig(num_blocks=8, block_size=4))
    both = plan_memory(tiny_model, EngineConfig(num_blocks=8, block_size=4), draft=tiny_draft)
    assert both.num_blocks == alone.num_blocks
    assert both.kv_bytes_per_block == alone.kv_bytes_per_block + _per_block(tiny_draft, 4)
    assert both.weights_bytes == alone.weights_bytes + module_bytes(tiny_draft)


def test_a_tied_head_is_counted_once(tiny_model: LlamaModel) -> None:
    shared = torch.nn.Embedding(10, 4)
    model = torch.nn.Module()
    model.a, model.b = shared, torch.nn.Linear(4, 10, bias=False)
    model.b.weight = shared.weight
    assert module_bytes(model) == 10 * 4 * 4


def test_the_weights_the_measured_kernels_hold_are_counted(tiny_llm_dir: Path) -> None:
    """A linear layer swapped for its measured kernels holds its weights outside its
    parameters: the plan counts the kernels' bytes, not only the embedding and norms."""
    from turboinfer.llm.backends.cpu.kernels import SelectedLinear

    llm = LLM(tiny_llm_dir, config=EngineConfig(num_blocks=4, block_size=4))
    model = llm.engine.model
    swapped = [m for m in model.modules() if isinstance(m, SelectedLinear)]
    assert swapped
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    held = sum(m.held_bytes() for m in swapped)
    # at least one float32 copy of every linear layer's weight (bias-free layers)
    assert held >= sum(m.in_features * m.out_features * 4 for m in swapped)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())    # rotary tables
    assert llm.engine.memory_plan.weights_bytes == module_bytes(model) == params + buffers + held


def test_the_engine_runs_on_its_plan_and_refuses_a_prompt_past_it(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(num_blocks=4, block_size=4))
    assert llm.engine.memory_plan.max_tokens == 16 == llm.engine.max_seq_len
    assert llm.engine.runner.kv_cache.num_blocks == 4
    with pytest.raises(InvalidInputError, match="KV cache holds 16"):
        llm.generate("the " * 20, SamplingParams(max_tokens=2))
    out = llm.generate("the value", SamplingParams(max_tokens=40, temperature=0,
                                                   ignore_eos=True))[0]
    assert len(out.prompt_token_ids) + len(out.token_ids) == 16


def test_llm_bench_json_reports_the_plan(tiny_llm_dir: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from turboinfer.cli import main

    assert main(["llm", "bench", str(tiny_llm_dir), "--json", "--concurrency", "1",
                 "--prompt-len", "4", "--gen-len", "3", "--kv-cache-tokens", "64",
                 "--block-size", "4", "--threads", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    plan = report["memory_plan"]
    assert (plan["num_blocks"], plan["block_size"], plan["max_tokens"]) == (16, 4, 64)
    assert plan["weights_bytes"] > 0 and plan["kv_bytes"] == 16 * plan["kv_bytes_per_block"]
    assert report["device"] == "cpu" and report["dtype"] == "float32"
