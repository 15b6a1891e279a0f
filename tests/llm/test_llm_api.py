"""``LLM(...).generate`` and the ``turboinfer llm`` command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turboinfer.cli import main
from turboinfer.llm import LLM, EngineConfig, SamplingParams
from turboinfer.llm.backends.cpu.native import native_status
from turboinfer.llm.backends.cpu.prefetch import f32_settings

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def test_generate_text_prompts(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024))
    outs = llm.generate(["the value of a list", "return the string"], GREEDY)
    assert [len(o.token_ids) for o in outs] == [8, 8]
    assert all(o.finish_reason == "length" for o in outs)
    assert outs[0].text == llm.tokenizer.decode(list(outs[0].token_ids))
    again = llm.generate("the value of a list", GREEDY)[0]
    assert again.token_ids == outs[0].token_ids


def test_stream_concatenates_to_the_generated_text(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024))
    streamed = "".join(llm.stream("the value of a list", GREEDY))
    assert streamed == llm.generate("the value of a list", GREEDY)[0].text


def test_stop_string_cuts_the_text(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024))
    full = llm.generate("the value", GREEDY)[0]
    words = full.text.split()
    stop = words[2]
    out = llm.generate("the value", SamplingParams(max_tokens=8, temperature=0,
                                                   ignore_eos=True, stop=(stop,)))[0]
    assert out.finish_reason == "stop"
    assert stop not in out.text
    assert full.text.startswith(out.text)


def test_cli_generate_streams(tiny_llm_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["llm", "generate", str(tiny_llm_dir), "--prompt", "the value",
                 "--max-tokens", "5", "--temperature", "0"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.startswith("the value") and len(out.split()) > 2


def test_cli_bench_json(tiny_llm_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["llm", "bench", str(tiny_llm_dir), "--concurrency", "1,4", "--prompt-len", "8",
                 "--gen-len", "6", "--ngram", "2", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["results"]
    # An fp32 model on the native step: its fp32 kernel's fetch ahead at several rows was
    # measured at each of the kernel's settings.
    if report["decode_path"] == "native":
        library = native_status().library
        assert library is not None
        assert set(report["f32_prefetch"]["step_ms"]["f32"]) == {
            str(s) for s in f32_settings(library)}
    assert [r["concurrency"] for r in rows] == [1, 4]
    assert all(r["tokens_per_s"] > 0 and r["ttft_p99_ms"] >= r["ttft_p50_ms"] for r in rows)
    assert rows[1]["output_tokens"] == 24


@pytest.mark.parametrize(("args", "message"), [
    (["--max-tokens", "0"], "max_tokens must be >= 1"),
    (["--temperature", "-1"], "temperature must be >= 0"),
    (["--prompt", "the " * 300], "the context holds 256"),
])
def test_cli_bad_input_is_one_line_error(tiny_llm_dir: Path, capsys: pytest.CaptureFixture[str],
                                         args: list[str], message: str) -> None:
    argv = ["llm", "generate", str(tiny_llm_dir), "--prompt", "the value", *args]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def test_cli_missing_model_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["llm", "generate", str(tmp_path / "nope"), "--prompt", "x"]) == 2
    assert "no such model folder" in capsys.readouterr().err


def test_stream_never_shows_the_stop_string(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024))
    words = llm.generate("the value", GREEDY)[0].text.split()
    stop = f"{words[2]} {words[3]}"
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, stop=(stop,))
    streamed = "".join(llm.stream("the value", params))
    # Had a piece of the stop string been shown, the stream could not match the final text.
    assert streamed == llm.generate("the value", params)[0].text
    assert streamed.split() == words[:2]


def test_quantization_from_the_config_or_the_argument(tiny_llm_dir: Path) -> None:
    from turboinfer.llm.model.config import QuantMode

    by_config = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024,
                                                      quant=QuantMode.INT8))
    assert by_config.config.quant is QuantMode.INT8
    by_argument = LLM(tiny_llm_dir, quant="int4",
                      config=EngineConfig(kv_cache_tokens=1024, quant=QuantMode.INT8))
    assert by_argument.config.quant is QuantMode.INT4


def test_fp8_runs_on_the_general_path_only(tiny_llm_dir: Path) -> None:
    # fp8 is torch._scaled_mm's (or its dequantizing fallback's): the CPU's native path
    # has no float8 kernel, and says so rather than running something else.
    from turboinfer.errors import InvalidInputError
    from turboinfer.llm.model.quant_device import Fp8Linear

    with pytest.raises(InvalidInputError, match="fp8 runs on the general path"):
        LLM(tiny_llm_dir, quant="fp8", config=EngineConfig(kv_cache_tokens=1024))
    llm = LLM(tiny_llm_dir, quant="fp8", dtype="bfloat16",
              config=EngineConfig(kv_cache_tokens=1024))
    layers = llm.quant_layers["target"]
    assert layers["kernel"] + layers["dequant"] == sum(
        isinstance(m, Fp8Linear) for m in llm.model.modules()) > 0
    assert len(llm.generate("the value", SamplingParams(max_tokens=4))[0].token_ids) > 0


def test_q8_runs_only_where_the_cpu_kernels_do(tiny_llm_dir: Path) -> None:
    # llama.cpp's Q8_0 layout exists as the CPU's native kernel (and its dequantized
    # fallback) only: another backend or dtype is told so, not quietly given int4.
    from turboinfer.errors import InvalidInputError

    llm = LLM(tiny_llm_dir, quant="q8", config=EngineConfig(kv_cache_tokens=1024))
    assert {c.chosen for c in llm.kernel_choices} <= {"q8_native", "q8_dequantized_fp32"}
    assert len(llm.generate("the value", SamplingParams(max_tokens=4))[0].token_ids) > 0
    for options in ({"backend": "torch"}, {"dtype": "bfloat16"}):
        with pytest.raises(InvalidInputError, match="q8 runs on the CPU"):
            LLM(tiny_llm_dir, quant="q8", config=EngineConfig(kv_cache_tokens=1024),
                **options)
