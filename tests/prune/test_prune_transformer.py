"""Heads and FFN channels of a Hugging Face BERT, on a tiny randomly initialized one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from turboinfer.prune.api import prune
from turboinfer.prune.data import TrainData
from turboinfer.prune.settings import DistillSettings, Objective, PruneSettings


@pytest.fixture
def tiny_bert() -> Any:
    transformers = pytest.importorskip("transformers")
    from turboinfer.models.minilm import MeanPooledEncoder

    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=32)
    torch.manual_seed(0)
    return MeanPooledEncoder(transformers.BertModel(config, add_pooling_layer=False)).eval()


@pytest.fixture
def token_data() -> TrainData:
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 64, (32, 12)).astype(np.int64)
    return TrainData({"input_ids": ids, "attention_mask": np.ones_like(ids)}, batch_size=8)


def test_heads_and_ffn_channels_go_and_the_hidden_size_stays(
    tiny_bert: Any, token_data: TrainData
) -> None:
    teacher_out = tiny_bert(*next(iter(token_data))[0])
    example = next(iter(token_data))[0]
    settings = PruneSettings(target_sparsity=0.5, taylor_batches=2,
                             distill=DistillSettings(epochs=2, objective=Objective.EMBEDDING))
    result = prune(tiny_bert, example, token_data, None, settings)
    assert result.heads_before == [4, 4] and result.heads_after == [2, 2]
    for layer in result.model.encoder.encoder.layer:
        assert layer.attention.self.query.out_features == 2 * 8  # whole heads of size 8
        assert layer.attention.self.num_attention_heads == 2
        assert layer.intermediate.dense.out_features == 32
        assert layer.output.dense.out_features == 32  # the hidden stream is protected
    out = result.model(*example)
    assert out.shape == teacher_out.shape
    assert torch.isfinite(out).all()
    assert len(result.distill_losses) == 2
