"""The decoder reproduces ``transformers`` token for token, and loading fails clearly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from llm_helpers import hf_greedy, make_engine, save_random_hf_model

from turboinfer.errors import ModelLoadError, UnknownModelError
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.model.loader import load_model

PROMPT = [5, 17, 99, 3, 42, 7, 64, 1, 2, 88, 31]


def greedy_engine(folder: Path, prompt: list[int], n: int) -> list[int]:
    engine = make_engine(load_model(folder), kv_cache_tokens=512, block_size=4)
    seq = engine.add_request(prompt, SamplingParams(max_tokens=n, temperature=0))
    while engine.has_unfinished():
        engine.step()
    return seq.output_token_ids


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_greedy_matches_transformers(tmp_path: Path, arch: str) -> None:
    folder = save_random_hf_model(tmp_path / arch, arch=arch)
    expected = hf_greedy(folder, PROMPT, 24)
    assert greedy_engine(folder, PROMPT, 24) == expected


def test_logits_match_transformers(tiny_llama_dir: Path) -> None:
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_dir).eval()
    ours = load_model(tiny_llama_dir)
    ids = torch.tensor(PROMPT)
    with torch.no_grad():
        want = hf(ids[None]).logits[0]
        got = ours.logits(ours(ids, torch.arange(len(PROMPT))))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_missing_folder() -> None:
    with pytest.raises(UnknownModelError, match="no such model folder"):
        load_model(Path("/nonexistent/model"))


def test_missing_weights(tmp_path: Path, tiny_llama_dir: Path) -> None:
    (tmp_path / "config.json").write_text((tiny_llama_dir / "config.json").read_text())
    with pytest.raises(ModelLoadError, match=r"no weights \(model.safetensors\)"):
        load_model(tmp_path)


def test_unsupported_architecture(tmp_path: Path, tiny_llama_dir: Path) -> None:
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"unsupported architecture.*GPT2LMHeadModel"):
        load_model(tmp_path)


def test_weights_not_matching_config(tmp_path: Path, tiny_llama_dir: Path) -> None:
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    config["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(tiny_llama_dir / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"weights missing layers\.2"):
        load_model(tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_model_is_loaded_from_the_files_tensors_as_they_are(tmp_path: Path,
                                                              dtype: torch.dtype) -> None:
    """Built without storage and given the file's tensors: every weight is the file's
    (widened to float32), the tied LM head is the embedding itself, the rotary tables are
    computed, and nothing is left on the meta device (an expert block's counters: the
    MoE tests run on such blocks)."""
    from safetensors.torch import load_file

    folder = save_random_hf_model(tmp_path, dtype=dtype, tie_word_embeddings=True)
    model = load_model(folder)
    assert model.lm_head.weight is model.embed_tokens.weight
    tensors = [*model.parameters(), *model.buffers()]
    assert all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
    file = load_file(str(folder / "model.safetensors"))
    embed = file["model.embed_tokens.weight"].float()
    assert torch.equal(model.embed_tokens.weight, embed)
    down = file["model.layers.1.mlp.down_proj.weight"].float()
    assert torch.equal(model.layers[1].mlp.down_proj.weight, down)
    assert torch.isfinite(model.rope.cos).all() and model.rope.cos.abs().max() <= 1


def test_loading_leaves_torch_s_compiler_unimported(tmp_path: Path) -> None:
    """Built on the meta device, the model runs no random initialiser and no arithmetic
    there: torch's meta versions of those import its compiler, about a second of every
    process's first load (``llm serve`` start-up). A fresh process, so nothing imported
    it before."""
    import subprocess
    import sys

    folder = save_random_hf_model(tmp_path)
    code = ("import sys; from turboinfer.llm.model.loader import load_model; "
            f"load_model({str(folder)!r}); print('torch._dynamo' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "False", done.stderr
