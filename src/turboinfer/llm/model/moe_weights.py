"""Expert weight names: Hugging Face checkpoints to the fused layout of ``llm/model/moe.py``.

Mixtral names experts ``block_sparse_moe.experts.<e>.w1|w3|w2`` (gate, up, down);
Qwen2-MoE ``mlp.experts.<e>.gate_proj|up_proj|down_proj`` plus ``mlp.shared_expert.*``
and ``mlp.shared_expert_gate``. Both become ``layers.<i>.mlp.experts.<e>.gate_up_proj``
and ``.down_proj`` (gate and up concatenated, as in the dense MLP).
"""

from __future__ import annotations

import re

import torch

from turboinfer.errors import ModelLoadError

_MIXTRAL_PROJ = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_EXPERT_KEY = re.compile(
    r"^(?:model\.)?layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\."
    r"(w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")


def expert_key(name: str) -> tuple[int, int, str] | None:
    """(layer, expert, 'gate_proj'|'up_proj'|'down_proj') for a routed expert's weight
    name in either layout; None for any other weight."""
    match = _EXPERT_KEY.match(name)
    if match is None:
        return None
    layer, expert, proj = match.groups()
    return int(layer), int(expert), _MIXTRAL_PROJ.get(proj, proj)


def fuse_expert(parts: dict[str, torch.Tensor], where: str,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up [2I, H], down [H, I]) from one expert's three HF projections."""
    missing = {"gate_proj", "up_proj", "down_proj"} - set(parts)
    if missing:
        raise ModelLoadError(f"weights: {where} lacks {', '.join(sorted(missing))}")
    return torch.cat([parts["gate_proj"], parts["up_proj"]]), parts["down_proj"]


def fuse_moe_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename (``model.`` already stripped) and fuse the routed and shared experts'
    weights; every other entry passes through."""
    out: dict[str, torch.Tensor] = {}
    experts: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
    shared: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in state.items():
        name = name.replace(".block_sparse_moe.", ".mlp.")
        key = expert_key(name)
        shared_match = re.match(r"^layers\.(\d+)\.mlp\.shared_expert\.(\w+)\.weight$", name)
        if key is not None:
            experts.setdefault(key[:2], {})[key[2]] = value
        elif shared_match is not None:
            shared.setdefault(int(shared_match.group(1)), {})[shared_match.group(2)] = value
        else:
            out[name] = value
    for (layer, expert), parts in experts.items():
        prefix = f"layers.{layer}.mlp.experts.{expert}"
        out[f"{prefix}.gate_up_proj.weight"], out[f"{prefix}.down_proj.weight"] = \
            fuse_expert(parts, f"layer {layer} expert {expert}")
    for layer, parts in shared.items():
        prefix = f"layers.{layer}.mlp.shared_expert"
        out[f"{prefix}.gate_up_proj.weight"], out[f"{prefix}.down_proj.weight"] = \
            fuse_expert(parts, f"layer {layer} shared expert")
    return out
