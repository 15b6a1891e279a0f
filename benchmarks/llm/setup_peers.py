"""Builds what ``compare.py`` runs, under /work/peers (never in the project's venv):

    python benchmarks/llm/setup_peers.py

1. ``llm110m-gqa``: the random 110M Llama of ``benchmarks/llm_serving`` (same
   ``transformers`` config and seed) with GQA, 12 query / 4 key-value heads, and that
   benchmark's 32,000-token byte-level BPE tokenizer (``llm110m``, built by
   ``benchmarks/llm_serving/build_model.py`` when missing).
2. Its GGUF: F32 by ``benchmarks/llm_serving/to_gguf.py`` (in ``gguf-venv``: gguf,
   safetensors, numpy), then Q8_0 and Q4_0 by llama.cpp's ``llama_model_quantize`` (in
   ``llamacpp-venv``: llama-cpp-python built from source with ``GGML_NATIVE``).
3. CTranslate2 fp32 and int8 conversions (``ct2`` venv: ``pip install torch==2.13.0
   ctranslate2 transformers``). The converter leaves ``bos_token``/``eos_token`` null
   for this tokenizer, which the Generator refuses; both are set to ``<|endoftext|>``
   (id 0, the model's EOS).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = Path("/work/peers")
BASE, MODEL = PEERS / "llm110m", PEERS / "llm110m-gqa"
SHAPE = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
             num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=1024,
             tie_word_embeddings=True)

QUANTIZE = """
import ctypes, sys, llama_cpp as lc
p = lc.llama_model_quantize_default_params()
p.ftype = getattr(lc, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
p.nthread = 2
sys.exit(lc.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
"""


def build_model() -> None:
    import torch
    import transformers

    if (MODEL / "model.safetensors").is_file():
        return
    if not (BASE / "tokenizer.json").is_file():
        subprocess.run([sys.executable, str(HERE.parent / "llm_serving" / "build_model.py"),
                        str(BASE)], check=True)
    MODEL.mkdir(parents=True, exist_ok=True)
    shutil.copy(BASE / "tokenizer.json", MODEL / "tokenizer.json")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SHAPE, bos_token_id=None, eos_token_id=0)
    transformers.LlamaForCausalLM(config).save_pretrained(MODEL, safe_serialization=True)


def build_gguf() -> None:
    f32 = Path(f"{MODEL}-f32.gguf")
    if not f32.is_file():
        subprocess.run([str(PEERS / "gguf-venv" / "bin" / "python"),
                        str(HERE.parent / "llm_serving" / "to_gguf.py"), str(MODEL), str(f32)],
                       check=True)
    for q in ("Q8_0", "Q4_0"):
        out = Path(f"{MODEL}-{q.lower()}.gguf")
        if not out.is_file():
            subprocess.run([str(PEERS / "llamacpp-venv" / "bin" / "python"), "-c", QUANTIZE,
                            str(f32), str(out), q], check=True)


def build_ct2() -> None:
    for q in ("float32", "int8"):
        out = Path(f"{MODEL}-ct2-{q}")
        if not out.is_dir():
            subprocess.run([str(PEERS / "ct2" / "bin" / "ct2-transformers-converter"),
                            "--model", str(MODEL), "--output_dir", str(out),
                            "--quantization", q], check=True)
        config = json.loads((out / "config.json").read_text())
        config["bos_token"] = config["bos_token"] or "<|endoftext|>"
        config["eos_token"] = config["eos_token"] or "<|endoftext|>"
        config["unk_token"] = config["unk_token"] or "<|endoftext|>"
        (out / "config.json").write_text(json.dumps(config, indent=2))


if __name__ == "__main__":
    build_model()
    build_gguf()
    build_ct2()
    print("ready:", MODEL)
