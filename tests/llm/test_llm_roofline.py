"""``llm bench --roofline``: the JSON's roofline figures agree with each other and with
the loaded weights (no timing thresholds: the machine is shared)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from turboinfer.cli import main
from turboinfer.llm.backends.cpu.kernels import read_bytes_per_token
from turboinfer.llm.model.loader import load_model


def _bench(tiny_llm_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    code = main(["llm", "bench", str(tiny_llm_dir), "--concurrency", "2", "--prompt-len", "4",
                 "--gen-len", "4", "--threads", "1", "--roofline", "--json", *extra])
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_roofline_fields_are_consistent(tiny_llm_dir: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    report = _bench(tiny_llm_dir, capsys, "--quant", "int8")
    roof = report["roofline"]
    # Batch 1 is added for the roofline even when not asked for.
    assert [r["concurrency"] for r in report["results"]] == [1, 2]
    assert report["threads"] == roof["threads"] == 1
    assert roof["bandwidth_gb_s"] > 0
    assert roof["bandwidth_gb_s"] == pytest.approx(
        roof["bandwidth_detail"]["1"]["bandwidth"] / 1e9)
    assert roof["roofline_tokens_per_s"] == pytest.approx(
        roof["bandwidth_gb_s"] * 1e9 / roof["bytes_per_token"])
    # Each step reads the weights and the keys and values of its context: the prompt (4)
    # and half the new tokens (2) on average, over every layer.
    assert roof["bytes_per_token"] == roof["weight_bytes_per_token"] + roof["kv_bytes_per_token"]
    config = json.loads((tiny_llm_dir / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_position = (2 * config["num_hidden_layers"] * config["num_key_value_heads"]
                    * head_dim * 4)     # float32 cache
    assert roof["kv_bytes_per_token"] == per_position * (4 + 4 // 2)
    assert roof["device"] == "cpu"
    batch1 = report["results"][0]
    assert roof["achieved_tokens_per_s"] == pytest.approx(1000 / batch1["tpot_p50_ms"])
    assert roof["fraction"] == pytest.approx(
        roof["achieved_tokens_per_s"] / roof["roofline_tokens_per_s"])
    # Every linear shape has a choice at one row and at 16, among the timed candidates
    # (int8: no prompt-chunk tier, which is fp32's).
    kernels = report["kernels"]
    assert {k["rows"] for k in kernels} == {1, 16}
    assert all(k["chosen"] in k["timings_ms"] for k in kernels)
    assert all(k["chosen"].startswith("int8") for k in kernels)
    # A lone sequence decodes in one native call when every layer has a native kernel.
    assert report["decode_path"] in {"native", "lean"}
    if all(k["chosen"] in {"int8_native", "int8_amx_native"} for k in kernels):
        assert report["decode_path"] == "native"


def test_bytes_per_token_follow_the_weight_format(tiny_llama_dir: Path) -> None:
    from turboinfer.llm.backends.cpu.kernels import select_kernels
    from turboinfer.llm.model.config import QuantMode

    plain = load_model(tiny_llama_dir)
    linears = sum(m.weight.numel() for m in plain.modules() if isinstance(m, torch.nn.Linear))
    fp32 = read_bytes_per_token(plain)
    # fp32: every linear weight, 4 bytes each, plus one embedding row and the norms.
    norms = sum(p.numel() for n, p in plain.named_parameters() if "norm" in n)
    assert fp32 == 4 * (linears + plain.config.hidden_size + norms)
    int8 = load_model(tiny_llama_dir)
    select_kernels(int8, QuantMode.INT8, measure=False)
    # int8: one byte per weight plus a scale per output channel.
    assert linears < read_bytes_per_token(int8) < fp32 / 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_bandwidth_is_measured_on_the_gpu() -> None:
    from turboinfer.llm.bench import measure_device_bandwidth

    found = measure_device_bandwidth(torch.device("cuda"), buffer_mb=256, reps=3)
    assert found["bandwidth"] == max(found["sum"], found["copy"]) > 0
