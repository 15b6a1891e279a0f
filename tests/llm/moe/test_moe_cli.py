"""``llm bench`` with the MoE and parallel flags: the JSON carries the expert cache,
prefetch, load-balance and all-reduce figures; a bad value is a one-line error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llm_helpers import save_word_tokenizer

from turboinfer.cli import main
from turboinfer.llm.model.experts import GIB

EXPERT_BYTES = (128 * 64 + 64 * 64) * 4


@pytest.fixture(scope="module")
def moe_llm_dir(qwen2_moe_dir: Path) -> Path:
    save_word_tokenizer(qwen2_moe_dir)
    return qwen2_moe_dir


def test_bench_json_reports_expert_cache_and_balance(moe_llm_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    budget = f"{8 * EXPERT_BYTES / GIB:.9f}"
    code = main(["llm", "bench", str(moe_llm_dir), "--concurrency", "2", "--prompt-len", "6",
                 "--gen-len", "6", "--threads", "1", "--expert-memory-gb", budget, "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["results"][0]["output_tokens"] == 12
    moe = report["moe"]
    assert moe["experts_per_layer"] == 8 and moe["top_k"] == 2
    assert len(moe["load_balance"]) == 2
    cache = moe["expert_cache"]
    assert cache["misses"] > 0 and cache["predicted"] > 0
    assert 0 <= cache["hit_rate"] <= 1 and 0 <= cache["prefetch_accuracy"] <= 1
    assert cache["resident_bytes"] <= cache["capacity_bytes"]
    assert cache["bytes_loaded_per_token"] > 0
    assert report["parallel"]["processes"] == 1


def test_bad_parallel_flags_are_one_line_errors(moe_llm_dir: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["llm", "bench", str(moe_llm_dir), "--tensor-parallel", "2",
                 "--expert-parallel", "4"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "must be equal" in err and "\n" not in err
    code = main(["llm", "bench", str(moe_llm_dir), "--expert-memory-gb", "-1"])
    assert code == 2
    assert "expert_memory_gb must be >= 0" in capsys.readouterr().err
