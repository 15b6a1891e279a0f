"""Tiny random Mixtral and Qwen2-MoE folders built by ``transformers`` (no download)."""

from __future__ import annotations

from pathlib import Path

import torch

MOE_TINY: dict[str, object] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
MIXTRAL = {"intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2}
QWEN2_MOE = {"intermediate_size": 128, "moe_intermediate_size": 64, "num_experts": 8,
             "num_experts_per_tok": 2, "shared_expert_intermediate_size": 96}


def save_random_moe_model(folder: Path, arch: str = "mixtral", seed: int = 0,
                          **overrides: object) -> Path:
    """A randomly initialised ``MixtralForCausalLM`` or ``Qwen2MoeForCausalLM`` folder."""
    import transformers  # why: heavy; only the reference side of the tests needs it

    classes = {
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM, MIXTRAL),
        "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                      QWEN2_MOE),
    }
    config_cls, model_cls, shape = classes[arch]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**MOE_TINY, **shape, **overrides}))
    with torch.no_grad():
        # Wider than the default init (std 0.02): peaked, tie-free logits and routers
        # that pick clearly different experts per token.
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
    model.save_pretrained(folder)
    return folder
