"""Tensor and expert parallelism over 2 processes (gloo on 127.0.0.1) give the same
greedy tokens as one process."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch.distributed
from llm_helpers import save_random_hf_model, save_word_tokenizer
from moe_helpers import save_random_moe_model

from turboinfer.errors import ConfigError, ModelLoadError
from turboinfer.llm import LLM, EngineConfig, SamplingParams
from turboinfer.llm.parallel import group
from turboinfer.llm.placement import placement_report

PROMPTS = [[5, 17, 99, 3, 42, 7, 64, 1, 2, 88, 31], [9, 8, 7], [100, 1, 50, 2, 60, 3, 70]]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
BASE = EngineConfig(kv_cache_tokens=512, block_size=4, num_threads=1)


def greedy(folder: Path, **parallel: int) -> list[tuple[int, ...]]:
    llm = LLM(folder, config=dataclasses.replace(BASE, **parallel))
    try:
        return [out.token_ids for out in llm.generate(PROMPTS, GREEDY)]
    finally:
        llm.placement.close()


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = save_random_hf_model(tmp_path_factory.mktemp("tp_llama"))
    save_word_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = save_random_moe_model(tmp_path_factory.mktemp("tp_qwen2_moe"), "qwen2_moe")
    save_word_tokenizer(folder)
    return folder


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tensor_parallel_2_matches_one_process(llama_dir: Path) -> None:
    assert greedy(llama_dir, tensor_parallel=2) == greedy(llama_dir)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tensor_parallel_2_on_the_general_path_matches_one_process(llama_dir: Path) -> None:
    """The general path (torch modules in any dtype, a GPU's path) shards too: each rank
    loads its shard in the dtype on its device, and the workers allocate the blocks rank
    0 planned."""
    llm = LLM(llama_dir, backend="torch", config=dataclasses.replace(BASE, tensor_parallel=2))
    try:
        assert llm.general and llm.placement.group is not None
        report = placement_report(llm.model, llm.config, 1)["parallel"]
        assert report["backend"] == "gloo" and report["processes"] == 2
        got = [out.token_ids for out in llm.generate(PROMPTS, GREEDY)]
    finally:
        llm.placement.close()
    single = LLM(llama_dir, backend="torch", config=BASE)
    assert got == [out.token_ids for out in single.generate(PROMPTS, GREEDY)]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_expert_and_tensor_parallel_2_match_one_process(moe_dir: Path) -> None:
    """Experts split over 2 ranks (the shared expert on rank 0); then heads, channels
    and the shared expert split with the routed experts still whole per rank."""
    expected = greedy(moe_dir)
    assert greedy(moe_dir, expert_parallel=2) == expected
    assert greedy(moe_dir, tensor_parallel=2, expert_parallel=2) == expected


def test_a_split_the_shape_cannot_take_is_refused_before_starting(llama_dir: Path) -> None:
    with pytest.raises(ConfigError, match="tensor parallel 3 does not divide"):
        LLM(llama_dir, config=dataclasses.replace(BASE, tensor_parallel=3))
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model"):
        LLM(llama_dir, config=dataclasses.replace(BASE, expert_parallel=2))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_that_cannot_load_is_reported_not_waited_for(
        llama_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers get a folder whose weights are missing (rank 0 loads a good copy):
    rank 0 names the failed rank instead of waiting for it at the rendezvous."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((llama_dir / "config.json").read_text())
    real = group.load_shard
    monkeypatch.setattr(group, "load_shard", lambda _folder, config, rank:
                        real(llama_dir, config, rank))
    with pytest.raises(ModelLoadError, match="worker rank 1 failed to load"):
        group.ParallelGroup(broken, dataclasses.replace(BASE, tensor_parallel=2))
    assert not torch.distributed.is_initialized()
