"""Choosing the device, dtype and backend; the torch backend on the CPU; CUDA runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from turboinfer.cli import main
from turboinfer.errors import InvalidInputError
from turboinfer.llm import LLM, EngineConfig, SamplingParams
from turboinfer.llm.backends.device import resolve_device, resolve_dtype

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
PROMPTS = ["the value of a list", "return the string", "a list of"]


def _general_path(llm: LLM) -> LLM:
    """The default CPU engine with every fast path off: today's general path."""
    runner = llm.engine.runner
    runner.lean_decode = runner.native_decode = runner.batch_decode = False
    return llm


def test_the_torch_backend_on_the_cpu_gives_the_general_paths_tokens(
        tiny_llm_dir: Path) -> None:
    cfg = EngineConfig(kv_cache_tokens=1024)
    torch_backend = LLM(tiny_llm_dir, config=cfg, device="cpu", backend="torch")
    assert torch_backend.general and torch_backend.config.backend == "torch"
    assert torch_backend.engine.runner.decode_path() == "general"
    general = _general_path(LLM(tiny_llm_dir, config=cfg))
    got = [o.token_ids for o in torch_backend.generate(PROMPTS, GREEDY)]
    want = [o.token_ids for o in general.generate(PROMPTS, GREEDY)]
    assert got == want
    # One at a time, too (batch-1 decode steps).
    assert torch_backend.generate(PROMPTS[0], GREEDY)[0].token_ids == want[0]


def test_a_seeded_sampled_request_repeats_on_the_torch_backend(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024), backend="torch")
    params = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, top_k=20, seed=3,
                            ignore_eos=True)
    first = llm.generate(PROMPTS, [params] * 3)
    again = llm.generate(PROMPTS, [params] * 3)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]


def test_a_bfloat16_model_on_the_cpu_runs_on_the_general_path(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024), dtype="bfloat16")
    assert llm.config.backend == "torch" and llm.model.lm_head.weight.dtype == torch.bfloat16
    assert llm.engine.runner.kv_cache.k.dtype == torch.bfloat16
    out = llm.generate(PROMPTS[0], GREEDY)[0]
    assert len(out.token_ids) == GREEDY.max_tokens


def test_device_and_dtype_names_resolve() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16
    with pytest.raises(InvalidInputError, match="unknown device"):
        resolve_device("tpu")
    with pytest.raises(InvalidInputError, match="unknown dtype"):
        resolve_dtype("int3", torch.device("cpu"))


@no_cuda
def test_auto_is_the_cpu_without_cuda() -> None:
    assert resolve_device("auto") == torch.device("cpu")


@no_cuda
def test_cuda_without_a_gpu_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["llm", "generate", "--device", "cuda", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "no CUDA device" in err and "\n" not in err
    with pytest.raises(InvalidInputError, match="no CUDA device"):
        LLM(device="cuda")


def test_the_graphs_backend_needs_cuda(tiny_llm_dir: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(InvalidInputError, match="needs a CUDA device"):
        LLM(tiny_llm_dir, backend="graphs")


@needs_cuda
def test_the_engine_on_cuda_gives_the_cpus_greedy_tokens_in_float32(tiny_llm_dir: Path,
                                                                     ) -> None:
    """float32 on the GPU, every step general or graphed: the CPU's greedy tokens."""
    cfg = EngineConfig(kv_cache_tokens=1024)
    want = [o.token_ids for o in _general_path(LLM(tiny_llm_dir, config=cfg))
            .generate(PROMPTS, GREEDY)]
    for backend in ("torch", "graphs", "auto"):
        gpu = LLM(tiny_llm_dir, config=cfg, device="cuda", dtype="float32", backend=backend)
        assert gpu.engine.runner.kv_cache.k.is_cuda
        assert [o.token_ids for o in gpu.generate(PROMPTS, GREEDY)] == want, backend


@needs_cuda
def test_the_engine_on_cuda_samples_speculates_and_plans_memory(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, device="cuda", ngram=2)
    plan = llm.engine.memory_plan
    assert plan.source == "free device memory" and plan.num_blocks > 0
    assert plan.activation_bytes > 0
    params = SamplingParams(max_tokens=8, temperature=0.8, top_k=10, seed=1, ignore_eos=True,
                            logprobs=2)
    first = llm.generate(PROMPTS, [params] * 3)
    assert [o.token_ids for o in first] == [o.token_ids
                                            for o in llm.generate(PROMPTS, [params] * 3)]
