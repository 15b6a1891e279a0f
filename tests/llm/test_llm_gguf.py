"""GGUF files in: the demo model written as a GGUF file the way llama.cpp's converter
writes one (q/k rows permuted, byte-level BPE tokenizer in the metadata), then loaded by
path. F32 tensors give the demo's own greedy output token for token; Q8_0 stays close;
an unsupported architecture, RoPE scaling or a corrupt file is a one-line error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from turboinfer.cli import main
from turboinfer.errors import ModelLoadError
from turboinfer.llm import LLM, SamplingParams
from turboinfer.llm.api import demo_model_dir, model_folder
from turboinfer.llm.backends.cpu import kernel_candidates
from turboinfer.llm.backends.cpu.kernel_candidates import NativeInt4Kernel, NativeQ8Kernel
from turboinfer.llm.backends.cpu.native import native_status
from turboinfer.llm.backends.cpu.native.layout import int4_tiles, q8_tiles
from turboinfer.llm.model.gguf import (
    convert_gguf,
    permute_rotary,
    q4_groups,
    unpermute_rotary,
)
from turboinfer.llm.model.loader import INT4_GROUPS_ATTR, load_model
from turboinfer.llm.model.quant import dequantize_int4_native, quantize_int4_native

gguf = pytest.importorskip("gguf")

PROMPTS = ["The module", "Return the number of", "def parse"]
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
          "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
          "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
          "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def _gguf_name(hf: str) -> str:
    if hf.startswith("model.layers."):
        _, _, index, rest = hf.split(".", 3)
        module, leaf = rest.rsplit(".", 1)
        return f"blk.{index}.{_LAYER[module]}.{leaf}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
            "output_norm.weight", "lm_head.weight": "output.weight"}[hf]


def write_gguf(folder: Path, path: Path, qtype: str = "F32", arch: str = "llama",
               extra: dict[str, float] | None = None, bos_id: int | None = None) -> Path:
    """``folder`` (an HF Llama folder) as llama.cpp's converter would write it."""
    config = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    for key, value in (extra or {}).items():
        writer.add_string(key, str(value))
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    special = {t["id"] for t in tok["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([t for t, _ in vocab])
    writer.add_token_types([3 if i in special else 1 for _, i in vocab])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m)
                             for m in tok["model"]["merges"]])
    writer.add_eos_token_id(config["eos_token_id"][0])
    if bos_id is not None:
        writer.add_bos_token_id(bos_id)
    writer.add_add_bos_token(False)
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    quant = getattr(gguf.GGMLQuantizationType, qtype)
    for hf, array in load_file(str(folder / "model.safetensors")).items():
        name = _gguf_name(hf)
        data = array.astype(np.float32)
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        if kind in heads:
            data = permute_rotary(data, heads[kind])
        if data.ndim == 2 and quant != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(name, gguf.quants.quantize(data, quant), raw_dtype=quant)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def demo_f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(demo_model_dir(), tmp_path_factory.mktemp("gguf") / "demo-f32.gguf")


@pytest.fixture(scope="module")
def _module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def _cache(_module_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # One folder for the module, not the user's: converted folders are keyed by each
    # file's path, and the native library, compiled into the cache folder, is then
    # compiled once here rather than once a test (~2.7 s each).
    monkeypatch.setenv("TURBOINFER_CACHE_DIR", str(_module_cache))


def test_the_rotary_permutation_round_trips() -> None:
    weight = np.arange(8 * 4 * 3, dtype=np.float32).reshape(8 * 4, 3)
    assert np.array_equal(unpermute_rotary(permute_rotary(weight, 4), 4), weight)
    assert not np.array_equal(permute_rotary(weight, 4), weight)


def test_an_f32_gguf_generates_what_the_folder_does(demo_f32: Path) -> None:
    params = SamplingParams(max_tokens=24, temperature=0)
    expected = [o.token_ids for o in LLM().generate(PROMPTS, params)]
    from_file = LLM(demo_f32)
    assert [o.token_ids for o in from_file.generate(PROMPTS, params)] == expected
    # The tokenizer came out of the file's metadata: the same ids as the folder's.
    assert from_file.tokenizer.encode("The module") == LLM().tokenizer.encode("The module")


def test_an_f16_gguf_file_keeps_its_weights_in_16_bits(tmp_path: Path) -> None:
    """F16 matrices are widened to float32 at load, where they are exactly fp16 numbers:
    the native kernel that keeps them in 16 bits is offered beside the fp32 one (its
    results are that kernel's; BF16 files take the same path). The demo model is stored
    in fp16, so its F16 file generates the folder's own greedy output."""
    if native_status().library is None:
        pytest.skip(f"native kernels absent: {native_status().reason}")
    llm = LLM(write_gguf(demo_model_dir(), tmp_path / "demo-f16.gguf", qtype="F16"))
    assert all("fp32_native_fp16_weights" in c.timings_ms
               for c in llm.kernel_choices if c.rows == 1)
    params = SamplingParams(max_tokens=24, temperature=0)
    assert ([o.token_ids for o in llm.generate(PROMPTS, params)]
            == [o.token_ids for o in LLM().generate(PROMPTS, params)])


def test_a_q8_gguf_stays_close(tmp_path: Path) -> None:
    path = write_gguf(demo_model_dir(), tmp_path / "demo-q8.gguf", qtype="Q8_0")
    folder = convert_gguf(path, tmp_path / "q8")
    ours = load_file(str(folder / "model.safetensors"))
    reference = load_file(str(demo_model_dir() / "model.safetensors"))
    for name, value in reference.items():
        value = value.astype(np.float32)
        error = np.abs(ours[name] - value).max() / (np.abs(value).max() + 1e-12)
        assert error < 0.01, name  # Q8_0: one scale per 32 values, 8 bits each


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_q4_blocks_reach_the_int4_kernel_as_they_are(tmp_path: Path, qtype: str) -> None:
    library = native_status().library
    if library is None:
        pytest.skip(f"native kernels absent: {native_status().reason}")
    path = write_gguf(demo_model_dir(), tmp_path / f"demo-{qtype}.gguf", qtype=qtype)
    tensor = next(t for t in gguf.GGUFReader(str(path)).tensors
                  if t.name == "blk.0.ffn_down.weight")
    groups = q4_groups(tensor)
    assert groups is not None
    # The groups hold the file's weights exactly.
    assert np.array_equal(
        dequantize_int4_native(*(torch.from_numpy(g) for g in groups)).numpy(),
        gguf.quants.dequantize(tensor.data, tensor.tensor_type))
    llm = LLM(path, quant="int4")
    layers = [llm.model.layers[0].self_attn.qkv_proj, llm.model.layers[0].mlp.gate_up_proj,
              llm.model.layers[0].mlp.down_proj]
    folder = model_folder(path)
    weights = load_file(str(folder / "model.safetensors"))
    loaded = dict(load_model(folder).named_modules())
    requantized_differs = False
    for layer in layers:
        # At every row count, whatever torch's int4 kernels measure: they would quantize
        # the float weights again.
        kernel = layer.kernel_for(1)
        assert isinstance(kernel, NativeInt4Kernel)
        assert layer.kernel_for(16) is kernel and layer.kernel_for(512) is kernel
        # Fused and un-permuted as the weights are, and taken by the kernel bit for bit.
        name = next(n for n, m in llm.model.named_modules() if m is layer)
        exact = getattr(loaded[name], INT4_GROUPS_ATTR)
        assert torch.equal(kernel.tiles, int4_tiles(*exact))
        fp32 = _fused_weight(weights, name)
        assert torch.equal(dequantize_int4_native(*exact), fp32)
        requantized_differs |= not torch.equal(int4_tiles(*quantize_int4_native(fp32)),
                                               kernel.tiles)
    # Q4_1's blocks span 0..15, so quantizing their float values again finds the same
    # groups; Q4_0's symmetric grid does not.
    assert requantized_differs == (qtype == "Q4_0")
    out = llm.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert all(len(o.token_ids) == 8 for o in out)


def test_q8_0_blocks_reach_the_q8_kernel_as_they_are(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Q8_0's scale is its block's amax / 127 and the largest weight lands on +-127, so
    # quantizing the dequantized block again finds the same scale and values.
    if native_status().library is None:
        pytest.skip(f"native kernels absent: {native_status().reason}")
    # Only the native kernel offered: which of it and the dequantized fp32 fallback a
    # small layer's timing picks is noise, and the question here is what the kernel holds.
    monkeypatch.setattr(kernel_candidates, "_torch_candidates", lambda mode, group: [])
    path = write_gguf(demo_model_dir(), tmp_path / "demo-q8.gguf", qtype="Q8_0")
    tensor = next(t for t in gguf.GGUFReader(str(path)).tensors
                  if t.name == "blk.1.ffn_down.weight")
    raw = np.asarray(tensor.data, dtype=np.uint8)
    blocks = raw.reshape(raw.shape[0], -1, 34)
    scales = torch.from_numpy(blocks[..., :2].copy().view(np.float16)[..., 0])
    values = torch.from_numpy(blocks[..., 2:].copy().view(np.int8).reshape(raw.shape[0], -1))
    llm = LLM(path, quant="q8")
    kernel = llm.model.layers[1].mlp.down_proj.kernel_for(1)
    assert isinstance(kernel, NativeQ8Kernel)
    assert torch.equal(kernel.tiles, q8_tiles(values, scales))
    out = llm.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert all(len(o.token_ids) == 8 for o in out)


def test_a_corrupt_int4_file_is_a_load_error(tmp_path: Path) -> None:
    path = write_gguf(demo_model_dir(), tmp_path / "demo-q4.gguf", qtype="Q4_1")
    folder = convert_gguf(path, tmp_path / "q4")
    assert load_model(folder).layers[0].mlp.down_proj.int4_groups is not None
    (folder / "int4.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelLoadError, match="cannot read the int4 weights"):
        load_model(folder)


def _fused_weight(weights: dict[str, np.ndarray], name: str) -> torch.Tensor:
    parts = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj",
                                    "self_attn.v_proj"),
             "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}
    layer, _, module = name.partition(".")[2].partition(".")
    keys = [f"model.layers.{layer}.{p}.weight" for p in parts.get(module, (module,))]
    return torch.cat([torch.from_numpy(weights[k]) for k in keys])


def test_the_cli_generates_from_a_gguf_file(demo_f32: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["llm", "generate", str(demo_f32), "--prompt", "The module",
                 "--max-tokens", "8"]) == 0
    assert capsys.readouterr().out.startswith("The module")


def test_unsupported_files_are_one_line_errors(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\x00" * 40)
    phi = write_gguf(demo_model_dir(), tmp_path / "phi.gguf", arch="phi2")
    scaled = write_gguf(demo_model_dir(), tmp_path / "scaled.gguf",
                        extra={"llama.rope.scaling.type": "yarn"})
    for path, words in ((corrupt, "not a readable GGUF file"),
                        (phi, "GGUF architecture 'phi2' is not supported"),
                        (scaled, "RoPE scaling (yarn) is not supported"),
                        (tmp_path / "missing.gguf", "no such GGUF file")):
        with pytest.raises(ModelLoadError, match=re.escape(words)):
            LLM(path)
        assert main(["llm", "generate", str(path), "--prompt", "x", "--max-tokens", "2"]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and "\n" not in err


def test_llm_convert_writes_a_folder_the_engine_loads(demo_f32: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    out = tmp_path / "converted"
    assert main(["llm", "convert", str(demo_f32), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    params = SamplingParams(max_tokens=8, temperature=0)
    assert (LLM(out).generate("The module", params)[0].token_ids
            == LLM().generate("The module", params)[0].token_ids)
    assert main(["llm", "convert", str(tmp_path / "none.gguf"), "-o", str(out)]) == 2


def test_the_converted_tokenizer_names_the_files_special_tokens(tmp_path: Path) -> None:
    # A BOS other than the EOS (transformers 5.17's converter named the BOS as both).
    path = write_gguf(demo_model_dir(), tmp_path / "bos.gguf", bos_id=1)
    out = convert_gguf(path, tmp_path / "converted")
    config = json.loads((out / "tokenizer_config.json").read_text())
    vocab = json.loads((demo_model_dir() / "tokenizer.json").read_text())["model"]["vocab"]
    names = {i: t for t, i in vocab.items()}
    assert (config["bos_token"], config["eos_token"]) == (names[1], "<|endoftext|>")


@pytest.mark.parametrize(("qtype", "mode"), [("Q4_1", "int4"), ("Q8_0", "q8"), ("F32", "none")])
def test_a_gguf_file_runs_its_own_quantization_unless_asked(tmp_path: Path, qtype: str,
                                                            mode: str) -> None:
    """As llama.cpp runs a file: Q4 blocks on the int4 kernel, Q8_0 on the q8 one, float
    weights as float; ``quant="none"`` keeps float32 weights."""
    if native_status().library is None:
        pytest.skip(f"native kernels absent: {native_status().reason}")
    path = write_gguf(demo_model_dir(), tmp_path / f"demo-{qtype}.gguf", qtype=qtype)
    llm = LLM(path)
    assert llm.config.quant.value == mode
    assert llm.quant_source == (f"the GGUF file's {qtype}" if mode != "none" else "the default")
    if mode != "none":
        asked = LLM(path, quant="none")
        assert asked.config.quant.value == "none" and asked.quant_source == "asked"
    out = llm.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert all(len(o.token_ids) == 6 for o in out)
