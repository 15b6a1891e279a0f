"""Write a Hugging Face Llama folder (safetensors, byte-level BPE tokenizer.json) as an
F32 GGUF for llama.cpp, with the ``gguf`` package (run in the peer's venv:
``pip install gguf safetensors numpy``).

    python to_gguf.py MODEL_DIR OUT.gguf

It does what llama.cpp's ``convert_hf_to_gguf.py`` does for a Llama: the same tensor
names, the Q/K rows permuted from Hugging Face's rotate-half order to llama.cpp's
interleaved RoPE order, and the tokenizer as a "gpt2" BPE vocabulary with its merges.
(``convert_hf_to_gguf.py`` itself refuses this tokenizer: it only accepts pre-tokenizers
whose hash it knows.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Hugging Face's [heads, 2, half, in] rotate-half rows to llama.cpp's interleaved."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def add_config(w: gguf.GGUFWriter, cfg: dict) -> None:
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_dimension_count(cfg["hidden_size"] // heads)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)


def add_tokenizer(w: gguf.GGUFWriter, folder: Path, eos: int) -> None:
    doc = json.loads((folder / "tokenizer.json").read_text())
    vocab = doc["model"]["vocab"]
    special = {t["id"] for t in doc.get("added_tokens", [])}
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # llama.cpp: the GPT-2 pre-tokenizer regex
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if vocab[t] in special else gguf.TokenType.NORMAL
                       for t in tokens])
    w.add_token_merges(merges)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(False)


def add_tensors(w: gguf.GGUFWriter, tensors: dict[str, np.ndarray], cfg: dict) -> None:
    heads = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads", heads)
    w.add_tensor("token_embd.weight", tensors["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", tensors["model.norm.weight"])
    if "lm_head.weight" in tensors:
        w.add_tensor("output.weight", tensors["lm_head.weight"])
    for i in range(cfg["num_hidden_layers"]):
        for hf, name in LAYER_NAMES.items():
            t = tensors[f"model.layers.{i}.{hf}.weight"].astype(np.float32)
            if name == "attn_q":
                t = permute(t, heads)
            elif name == "attn_k":
                t = permute(t, kv)
            w.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(t))


def main(folder: Path, out: Path) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    eos = cfg["eos_token_id"]
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(folder.name)
    add_config(w, cfg)
    add_tokenizer(w, folder, eos[0] if isinstance(eos, list) else eos)
    add_tensors(w, load_file(str(folder / "model.safetensors")), cfg)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
