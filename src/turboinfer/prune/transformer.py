"""Hugging Face BERT encoders: prune whole attention heads and FFN channels.

The hidden size is the residual stream every layer adds into, shared with the
embeddings; cutting it touches everything at once and hurts most, so it is protected
by ignoring the layers that write into it. What remains prunable per layer is exactly
the heads (query/key/value outputs, grouped by head) and the FFN's inner channels.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, cast

from torch import nn

from turboinfer.prune.schedule import PrunerSpec

if TYPE_CHECKING:  # annotations only: the module is optional (the prune extra)
    import torch_pruning as tp

_BERT_MODULE = "transformers.models.bert.modeling_bert"


def _bert_classes() -> dict[str, type[nn.Module]] | None:
    # A model built from BERT classes has imported them already; looking in sys.modules
    # spares every other model the seconds that importing transformers takes.
    bert = sys.modules.get(_BERT_MODULE)
    if bert is None:
        return None
    return {
        "attention": bert.BertSelfAttention,
        "layer": bert.BertLayer,
        "attention_out": bert.BertSelfOutput,
        "ffn_out": bert.BertOutput,
        "embeddings": bert.BertEmbeddings,
        "pooler": bert.BertPooler,
    }


def is_bert(model: nn.Module) -> bool:
    classes = _bert_classes()
    return classes is not None and any(
        isinstance(m, classes["attention"]) for m in model.modules()
    )


def attentions(model: nn.Module) -> list[Any]:
    """The BERT self-attention modules (typed loosely: their fields are plain attributes)."""
    classes = _bert_classes()
    if classes is None:
        return []
    return [m for m in model.modules() if isinstance(m, classes["attention"])]


def bert_spec(model: nn.Module) -> PrunerSpec:
    """Heads grouped per attention; hidden-stream writers, embeddings and pooler protected."""
    classes = _bert_classes()
    assert classes is not None  # only called after is_bert
    num_heads: dict[nn.Module, int] = {}
    for attention in attentions(model):
        for projection in (attention.query, attention.key, attention.value):
            num_heads[projection] = int(attention.num_attention_heads)
    ignored: list[nn.Module] = []
    for module in model.modules():
        if isinstance(module, classes["attention_out"] | classes["ffn_out"]):
            ignored.append(cast(nn.Module, module.dense))
        elif isinstance(module, classes["embeddings"] | classes["pooler"]):
            ignored.append(module)
    return PrunerSpec(ignored=ignored, num_heads=num_heads, after_step=sync_heads)


def sync_heads(pruner: tp.pruner.MetaPruner) -> None:
    """Keep each attention's head bookkeeping equal to its pruned projections.

    BERT's forward reshapes with ``-1`` heads, so it would run without this, but the
    attributes are what a reader (and any later head pruning) trusts.
    """
    for attention in attentions(pruner.model):
        heads = int(pruner.num_heads.get(attention.query, attention.num_attention_heads))
        attention.num_attention_heads = heads
        attention.all_head_size = heads * attention.attention_head_size


def head_counts(model: nn.Module) -> list[int]:
    """Attention heads per layer, in layer order."""
    return [int(a.query.out_features // a.attention_head_size) for a in attentions(model)]


def hidden_taps(model: nn.Module) -> list[str]:
    """Names of the encoder layers: their outputs are the hidden stream pruning keeps."""
    classes = _bert_classes()
    if classes is None:
        return []
    return [name for name, m in model.named_modules() if isinstance(m, classes["layer"])]
