"""Reading and writing Hugging Face-format model folders.

A folder holds ``config.json``, weights as ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``) and usually ``tokenizer.json``. Separate q/k/v and
gate/up projections are fused into the layout ``model.LlamaModel`` uses. A folder
converted from a GGUF file may also hold its Q4_0/Q4_1 projections as int4 groups
(``int4.safetensors``, ``model/gguf.py``): they are fused the same way and kept on the
projections (``INT4_GROUPS_ATTR``) for the native int4 kernel to take as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn
from torch.overrides import TorchFunctionMode

from turboinfer.errors import ModelLoadError, UnknownModelError
from turboinfer.llm.model.config import ModelConfig
from turboinfer.llm.model.gguf import EXACT_INT4_FILE, INT4_PARTS
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.moe import build_model
from turboinfer.llm.model.moe_weights import fuse_moe_weights
from turboinfer.llm.model.quant import NATIVE_GROUP

INT4_GROUPS_ATTR = "int4_groups"   # (packed [N, K/2] uint8, scales, minimums [N, K/32] fp16)

_FUSED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise ModelLoadError(f"{folder}: only safetensors weights are supported")
    raise ModelLoadError(f"{folder}: no weights (model.safetensors) found")


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in _weight_files(folder):
        if not file.is_file():
            raise ModelLoadError(f"{folder}: weight shard {file.name} is missing")
        try:
            tensors.update(load_file(str(file)))
        except (SafetensorError, OSError) as exc:
            raise ModelLoadError(f"{file}: cannot read weights ({exc})") from None
    return tensors


def hf_to_fused(hf: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Rename HF keys (``model.layers.0.self_attn.q_proj.weight``) and fuse projections."""
    out: dict[str, torch.Tensor] = {}
    for key, value in hf.items():
        name = key.removeprefix("model.")
        if "rotary_emb" in name:
            continue
        out[name] = value
    if config.moe is not None:
        out = fuse_moe_weights(out)
    for i in range(config.num_hidden_layers):
        for fused, parts in _FUSED.items():
            for kind in ("weight", "bias"):
                keys = [f"layers.{i}.{p}.{kind}" for p in parts]
                present = [k for k in keys if k in out]
                if not present:
                    continue
                if len(present) != len(keys):
                    missing = sorted(set(keys) - set(present))
                    raise ModelLoadError(f"weights: missing {', '.join(missing)}")
                out[f"layers.{i}.{fused}.{kind}"] = torch.cat([out.pop(k) for k in keys])
    if config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def fused_to_hf(state: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """Inverse of ``hf_to_fused``, for writing folders ``transformers`` can read."""
    q, kv = (config.num_attention_heads * config.head_dim,
             config.num_key_value_heads * config.head_dim)
    out: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        prefix, _, kind = name.rpartition(".")
        if prefix.endswith("qkv_proj"):
            base = prefix.removesuffix("qkv_proj")
            for part, chunk in zip(("q_proj", "k_proj", "v_proj"),
                                   value.split([q, kv, kv]), strict=True):
                out[f"model.{base}{part}.{kind}"] = chunk.contiguous()
        elif prefix.endswith("gate_up_proj"):
            base = prefix.removesuffix("gate_up_proj")
            gate, up = value.chunk(2)
            out[f"model.{base}gate_proj.{kind}"] = gate.contiguous()
            out[f"model.{base}up_proj.{kind}"] = up.contiguous()
        else:
            out[name if name == "lm_head.weight" else f"model.{name}"] = value.contiguous()
    return out


class _NoRandomInit(TorchFunctionMode):
    """Leaves the random initialisers alone on meta tensors, which have nothing to fill.

    Not only wasted work: torch's meta version of ``normal_`` (an embedding's init) imports
    its compiler, 1.0-1.3 s of every first load in a process. A function mode is
    per-thread, so a model built at the same time on another thread keeps its init."""

    RANDOM = frozenset({"normal_", "uniform_", "trunc_normal_", "kaiming_uniform_",
                        "kaiming_normal_", "xavier_uniform_", "xavier_normal_"})

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in self.RANDOM:
            tensor = args[0] if args else kwargs.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def load_model(folder: Path, *, dtype: torch.dtype = torch.float32) -> LlamaModel:
    folder = Path(folder)
    if not folder.is_dir():
        raise UnknownModelError(f"{folder}: no such model folder")
    config = ModelConfig.from_file(folder / "config.json")
    state = hf_to_fused(read_state_dict(folder), config)
    # Built without storage and given the file's tensors as they are (assign): no random
    # initialisation to overwrite, and no float32 copy beside the file's bf16 one while
    # loading; each tensor is widened on its own below (a bf16 Llama of 1.2 B parameters:
    # 7.0 s and 7.2 GiB at the peak against 14.5 s and 8.3 GiB when built and then filled,
    # benchmarks/llm/load_memory.py).
    with torch.device("meta"), _NoRandomInit():
        model = build_model(config)
    expected = set(model.state_dict())
    if config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if missing:
        raise ModelLoadError(f"{folder}: weights missing {', '.join(missing[:5])}"
                             + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    if unexpected:
        raise ModelLoadError(f"{folder}: unexpected weights {', '.join(unexpected[:5])}")
    for name, param in model.state_dict().items():
        if name in state and state[name].shape != param.shape:
            raise ModelLoadError(f"{folder}: weight {name} has shape "
                                 f"{tuple(state[name].shape)}, config implies {tuple(param.shape)}")
    model.load_state_dict(state, strict=False, assign=True)
    del state       # the parameters hold the tensors now: each freed once widened
    if config.tie_word_embeddings:      # assign replaced the embedding's parameter only
        model.lm_head.weight = model.embed_tokens.weight
    _off_meta(model, folder)
    model.to(dtype)
    model.eval()
    model.requires_grad_(False)
    if dtype == torch.float32:
        attach_int4_groups(model, folder, config)
    return model


def _off_meta(model: LlamaModel, folder: Path) -> None:
    """What a model built without storage still lacks once the file's tensors are in:
    the modules' plain tensors, counters that start at zero (an expert block's tokens per
    expert). (The rotary tables are computed on the CPU even then.)"""
    for module in model.modules():
        counters = [(name, value) for name, value in vars(module).items()
                    if isinstance(value, torch.Tensor) and value.is_meta]
        for name, value in counters:
            setattr(module, name, torch.zeros(value.shape, dtype=value.dtype))
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()]
            if t.is_meta]
    if left:
        raise ModelLoadError(f"{folder}: no weights for {', '.join(left[:5])}")


def attach_int4_groups(model: LlamaModel, folder: Path, config: ModelConfig) -> int:
    """Keep the folder's exact int4 groups (``int4.safetensors``) on the projections they
    quantize, fused as the weights are (a fused projection only where all its parts have
    them); returns how many projections got them."""
    file = folder / EXACT_INT4_FILE
    if not file.is_file():
        return 0
    try:
        raw = load_file(str(file))
    except (SafetensorError, OSError) as exc:
        raise ModelLoadError(f"{file}: cannot read the int4 weights ({exc})") from None
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in raw.items():
        owner, _, part = key.rpartition(".")
        groups.setdefault(owner.removeprefix("model."), {})[part] = value
    for i in range(config.num_hidden_layers):
        for fused, parts in _FUSED.items():
            found = [groups.pop(f"layers.{i}.{p}", None) for p in parts]
            if all(f is not None and set(INT4_PARTS) <= set(f) for f in found):
                groups[f"layers.{i}.{fused}"] = {
                    part: torch.cat([f[part] for f in found if f is not None])
                    for part in INT4_PARTS}
    modules = dict(model.named_modules())
    attached = 0
    for name, held in groups.items():
        module = modules.get(name)
        if not isinstance(module, nn.Linear) or not set(INT4_PARTS) <= set(held):
            continue
        packed, scales, mins = (held[p] for p in INT4_PARTS)
        n, k = module.weight.shape
        if (packed.shape != (n, k // 2) or scales.shape != (n, k // NATIVE_GROUP)
                or mins.shape != scales.shape):
            raise ModelLoadError(f"{file}: int4 weights of {name} do not match its "
                                 f"{n}x{k} weight")
        setattr(module, INT4_GROUPS_ATTR, (packed, scales, mins))
        attached += 1
    return attached


def hf_config_dict(config: ModelConfig) -> dict[str, object]:
    arch = {v: k for k, v in {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                              "Qwen2ForCausalLM": "qwen2"}.items()}[config.architecture]
    return {
        "architectures": [arch],
        "model_type": config.architecture,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "hidden_act": "silu",
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_ids) or None,
        "torch_dtype": "float16",
    }


def save_model(model: LlamaModel, folder: Path, *, dtype: torch.dtype = torch.float16) -> None:
    """Write ``config.json`` + ``model.safetensors`` in the Hugging Face layout."""
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config
    state = {k: v.detach().to(dtype) for k, v in model.state_dict().items()}
    save_file(fused_to_hf(state, config), str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config_dict(config), indent=2) + "\n")
