"""GGUF files (llama.cpp's format) in: a Hugging Face-format folder the engine loads.

``gguf_folder(path)`` converts a ``.gguf`` file once into a folder in the cache
(``$TURBOINFER_CACHE_DIR/gguf``, keyed by the file's path, size and modification time) and
returns it; ``convert_gguf`` writes that folder anywhere (``turboinfer llm convert``).
What is read from the file:

- the architecture and hyper-parameters from its metadata (``llama`` and ``qwen2``; a
  Mistral file says ``llama``); another architecture, or RoPE scaling, is a one-line
  error naming it;
- every tensor, dequantized to float32 by the ``gguf`` package (Q4_0/Q4_1/Q5/Q8_0, the
  K-quants, F16/BF16; a type it cannot read is an error naming the tensor and type);
  the engine then quantizes again as ``--quant`` asks;
- Q4_0 and Q4_1 projections also as they are, in the native int4 kernel's layout
  (``int4.safetensors``): a block of 32 is one of its groups (fp16 scale ``d``, fp16
  minimum ``m``, or ``-8 d`` for Q4_0's offset 8, byte ``j`` = ``q[j] | q[j+16] << 4``
  in both), so ``--quant int4`` runs the file's own weights bit for bit instead of
  quantizing their float values again (which, from Q4_0's symmetric grid, lands on
  another grid);
- llama.cpp stores a Llama's q/k projections with each head's rotary halves interleaved
  (its converter permutes them for its RoPE kernel); they are put back in the order of
  the Hugging Face weights this engine's RoPE expects (Qwen2 files are not permuted);
- the tokenizer and chat template, through ``transformers``' GGUF tokenizer converter,
  saved as ``tokenizer.json`` / ``tokenizer_config.json``;
- which quantized types the layers' projections have (``gguf.json``): where they are all
  Q4_0/Q4_1 or all Q8_0, a model loaded without a quantization asked for runs the file's
  own (``own_quant``: int4 or q8, the blocks as they are), as llama.cpp would run it,
  instead of float32 weights four to eight times the file's size.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from turboinfer.cache_folder import cache_folder
from turboinfer.errors import MissingDependencyError, ModelLoadError

# GGUF architecture -> (Hugging Face architecture, model_type, q/k permuted by llama.cpp)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama", True),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", False),
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
              "output": "lm_head"}
_FORMAT = 4  # bumped when the converted folder's layout or contents change
SOURCE_FILE = "gguf.json"   # what the folder was converted from: the projections' types
# The file's own quantization, as the engine's mode that runs it: Q4_0/Q4_1 blocks on the
# int4 kernel as they are, Q8_0 blocks on the q8 kernel (re-quantizing a dequantized Q8_0
# block finds its scale and values again).
OWN_QUANT = {"Q4_0": "int4", "Q4_1": "int4", "Q8_0": "q8"}
EXACT_INT4_FILE = "int4.safetensors"
# The int4 tensors' key suffixes, after the projection's HF name (``...q_proj``).
INT4_PARTS = ("int4_packed", "int4_scales", "int4_mins")
_Q4_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}     # fp16 d (and m), then 16 bytes of nibbles


def gguf_folder(path: Path) -> Path:
    """The cached folder converted from the GGUF file ``path`` (converted on first use)."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such GGUF file")
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{_FORMAT}"
                         .encode()).hexdigest()[:16]
    folder = _cache_dir() / f"{path.stem}-{key}"
    if (folder / "config.json").is_file():
        return folder
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        convert_gguf(path, tmp)
        if not folder.exists():
            os.replace(tmp, folder)  # a whole folder appears at once, or none
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def convert_gguf(path: Path, out: Path) -> Path:
    """Write ``config.json``, ``model.safetensors`` and the tokenizer of ``path`` to ``out``."""
    reader = _reader(path)
    fields = _metadata(reader)
    arch = str(fields.get("general.architecture", "?"))
    if arch not in ARCHITECTURES:
        raise ModelLoadError(f"{path}: GGUF architecture {arch!r} is not supported "
                             f"(supported: {', '.join(ARCHITECTURES)})")
    shapes = {t.name: [int(d) for d in t.shape] for t in reader.tensors}
    config = _config(fields, arch, shapes, path)
    out.mkdir(parents=True, exist_ok=True)
    tensors, int4 = _tensors(reader, arch, config, path)
    save_file(tensors, str(out / "model.safetensors"))
    if int4:
        save_file(int4, str(out / EXACT_INT4_FILE))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    projections = sorted({t.tensor_type.name for t in reader.tensors
                          if t.name.startswith("blk.") and len(t.shape) == 2})
    (out / SOURCE_FILE).write_text(json.dumps({"file": path.name,
                                               "projection_types": projections}) + "\n")
    _save_tokenizer(path, out)
    _name_special_tokens(out, _special_tokens(reader, fields))
    return out


def own_quant(folder: Path) -> tuple[str, str] | None:
    """For a folder converted from a GGUF file whose layers' projections are all one
    quantized type the engine runs as it is: (the engine's quant mode, the GGUF type);
    else None (float weights, K-quants, mixed types: the weights load as float32)."""
    try:
        types = json.loads((Path(folder) / SOURCE_FILE).read_text())["projection_types"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if len(types) == 1 and types[0] in OWN_QUANT:
        return OWN_QUANT[types[0]], types[0]
    return None


def _reader(path: Path) -> Any:
    try:
        from gguf import GGUFReader  # why: optional (the gguf extra), only for GGUF files
    except ImportError:
        raise MissingDependencyError("reading GGUF files needs the gguf package: "
                                     "pip install 'turboinfer[gguf]'") from None
    try:
        return GGUFReader(str(path))
    except (ValueError, OSError, IndexError, KeyError) as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file ({exc})") from None


def _metadata(reader: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "merges", "scores",
                                                                "token_type")):
            continue  # large arrays the tokenizer converter reads itself
        try:
            out[key] = field.contents()
        except (ValueError, IndexError):
            continue
    return out


def _config(fields: dict[str, Any], arch: str, names: dict[str, list[int]], path: Path
            ) -> dict[str, Any]:
    """config.json from the metadata; ``names`` maps each tensor to its GGUF shape."""
    def get(key: str, default: Any = None) -> Any:
        value = fields.get(f"{arch}.{key}", default)
        if value is None:
            raise ModelLoadError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    scaling = fields.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") or "rope_freqs.weight" in names:
        raise ModelLoadError(f"{path}: RoPE scaling ({scaling or 'rope_freqs'}) is not "
                             "supported")
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    hf_arch, model_type, _ = ARCHITECTURES[arch]
    eos = fields.get("tokenizer.ggml.eos_token_id")
    return {
        "architectures": [hf_arch], "model_type": model_type,
        # GGUF shapes run innermost first: the embedding is [hidden, vocab].
        "vocab_size": int(fields.get(f"{arch}.vocab_size")
                          or names.get("token_embd.weight", [0, 0])[-1]),
        "hidden_size": hidden, "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": int(get("attention.key_length", hidden // heads)),
        "max_position_embeddings": int(get("context_length", 2048)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "hidden_act": "silu",
        "bos_token_id": fields.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": None if eos is None else [int(eos)],
        "torch_dtype": "float32",
    }


def _tensors(reader: Any, arch: str, config: dict[str, Any], path: Path
             ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The float32 tensors by HF name, and the Q4_0/Q4_1 projections' int4 groups."""
    from gguf.quants import dequantize  # why: optional (the gguf extra)

    permuted = ARCHITECTURES[arch][2]
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out: dict[str, torch.Tensor] = {}
    int4: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            raise ModelLoadError(f"{path}: unexpected GGUF tensor {tensor.name!r}")
        try:
            array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except NotImplementedError:
            raise ModelLoadError(f"{path}: tensor {tensor.name} is "
                                 f"{tensor.tensor_type.name}, which cannot be read") from None
        kind = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        groups = q4_groups(tensor) if name.startswith(("model.layers.", "lm_head")) else None
        if permuted and kind in heads:
            array = unpermute_rotary(array, heads[kind])
            if groups is not None:
                groups = (unpermute_rotary(groups[0], heads[kind]),
                          unpermute_rotary(groups[1], heads[kind]),
                          unpermute_rotary(groups[2], heads[kind]))
        out[name] = torch.from_numpy(np.array(array, dtype=np.float32, order="C", copy=True))
        for part, group in zip(INT4_PARTS, groups or (), strict=False):  # none or three
            int4[f"{name.removesuffix('.weight')}.{part}"] = torch.from_numpy(
                np.ascontiguousarray(group))
    return out, int4


def q4_groups(tensor: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A Q4_0 / Q4_1 tensor's blocks as the native int4 kernel's groups: (packed
    ``[N, K/2]`` uint8, scales ``[N, K/32]`` fp16, minimums ``[N, K/32]`` fp16); None for
    another type. Q4_1 stores ``w = d q + m``; Q4_0 ``w = d (q - 8)``, that is ``m = -8 d``
    (exact in fp16: a power of two times ``d``)."""
    kind = tensor.tensor_type.name
    if kind not in _Q4_BLOCK_BYTES:
        return None
    raw = np.asarray(tensor.data, dtype=np.uint8)
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, _Q4_BLOCK_BYTES[kind])
    scales = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    if kind == "Q4_1":
        mins, nibbles = blocks[..., 2:4].copy().view(np.float16)[..., 0], blocks[..., 4:]
    else:
        mins, nibbles = (scales * np.float16(-8)).astype(np.float16), blocks[..., 2:]
    return nibbles.reshape(rows, -1), scales, mins


def hf_name(gguf_name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    return None


def unpermute_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation: within each head, rows ``[0, 2, 4, ...]`` and
    ``[1, 3, 5, ...]`` back to the two halves Hugging Face's rotate_half pairs."""
    rest = weight.shape[1:]
    half = weight.shape[0] // heads // 2
    return (weight.reshape(heads, half, 2, *rest).swapaxes(1, 2)
            .reshape(weight.shape))


def permute_rotary(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's permutation (its converter's ``permute``), the inverse of the above."""
    rest = weight.shape[1:]
    half = weight.shape[0] // heads // 2
    return (weight.reshape(heads, 2, half, *rest).swapaxes(1, 2)
            .reshape(weight.shape))


def _save_tokenizer(path: Path, out: Path) -> None:
    from transformers import AutoTokenizer  # why: heavy; its GGUF tokenizer converter

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, OSError) as exc:
        raise ModelLoadError(f"{path}: cannot read the GGUF tokenizer ({exc})") from None
    except (AttributeError, TypeError, IndexError) as exc:   # inside the converter
        import transformers  # why: its version names the culprit

        raise ModelLoadError(f"{path}: transformers {transformers.__version__} cannot "
                             f"convert this GGUF tokenizer ({type(exc).__name__}: {exc}); "
                             "another transformers release may") from None
    tokenizer.save_pretrained(str(out))


def _special_tokens(reader: Any, fields: dict[str, Any]) -> dict[str, str]:
    """The BOS and EOS tokens' texts, by the ids the file's metadata names."""
    field = reader.fields.get("tokenizer.ggml.tokens")
    if field is None:
        return {}
    found = {}
    for name in ("bos", "eos"):
        index = fields.get(f"tokenizer.ggml.{name}_token_id")
        if index is not None and 0 <= int(index) < len(field.data):
            found[f"{name}_token"] = str(field.contents(int(index)))
    return found


def _name_special_tokens(out: Path, tokens: dict[str, str]) -> None:
    """``tokenizer_config.json`` names the special tokens the file's metadata names (a
    ``transformers`` converter has named the BOS as the EOS; templates and the BOS rule
    read them there)."""
    path = out / "tokenizer_config.json"
    if not tokens or not path.is_file():
        return
    config = json.loads(path.read_text())
    config.update(tokens)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _cache_dir() -> Path:
    return cache_folder("gguf", create=True)
