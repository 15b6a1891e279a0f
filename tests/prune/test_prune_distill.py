"""Distillation mechanics: length buckets, learning-rate schedule, dropout, feature loss."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from turboinfer.prune.data import TrainData, batch_count
from turboinfer.prune.distill import distill, feature_loss
from turboinfer.prune.settings import DistillSettings, Objective
from turboinfer.prune.zoo import recombined


def _token_data(lengths: list[int], batch_size: int) -> TrainData:
    ids = np.zeros((len(lengths), max(lengths) + 3), dtype=np.int64)
    for row, length in enumerate(lengths):
        ids[row, :length] = row + 1  # the row number identifies the sample
    return TrainData({"ids": ids, "mask": (ids > 0).astype(np.int64)}, batch_size=batch_size,
                     lengths=np.array(lengths))


def test_length_buckets_cut_each_batch_to_its_longest_and_keep_every_sample() -> None:
    lengths = [2, 9, 3, 8, 2, 9, 3, 8]
    data = _token_data(lengths, batch_size=2)
    seen = []
    for (ids, mask), _ in data:
        rows = [int(r[0]) - 1 for r in ids]
        assert ids.shape[1] == max(lengths[r] for r in rows)  # no column of pure padding
        assert len({lengths[r] for r in rows}) == 1  # equal lengths share a batch
        assert mask.shape == ids.shape
        seen += rows
    assert sorted(seen) == list(range(len(lengths)))
    assert batch_count(data) == 4


def test_length_buckets_come_in_a_new_order_every_epoch() -> None:
    data = _token_data(list(range(1, 33)), batch_size=4)
    first = [int(ids[0, 0]) for (ids, _), _ in data]
    second = [int(ids[0, 0]) for (ids, _), _ in data]
    assert sorted(first) == sorted(second) and first != second


def test_recombined_texts_join_a_start_and_an_end_of_the_given_sentences() -> None:
    texts = ("alpha beta gamma", "one two three four")
    out = recombined(texts, 50, seed=0)
    assert len(out) == 50 and out == recombined(texts, 50, seed=0)
    vocabulary = {w for t in texts for w in t.split()}
    assert all(set(t.split()) <= vocabulary for t in out)
    assert any(t.split()[0] == "alpha" and t.split()[-1] == "four" for t in out)


def test_feature_loss_ignores_scale_and_sees_direction() -> None:
    x = torch.randn(2, 5, 8)
    assert float(feature_loss([3.0 * x], [x])) == pytest.approx(0.0, abs=1e-6)
    assert float(feature_loss([-x], [x])) == pytest.approx(2.0)


class _DropoutNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.linear(x))


@pytest.mark.parametrize(("objective", "dropout_active"),
                         [(Objective.EMBEDDING, False), (Objective.LOGITS, True)])
def test_dropout_is_off_only_when_distilling_embeddings(
    objective: Objective, dropout_active: bool
) -> None:
    torch.manual_seed(0)
    student, teacher = _DropoutNet(), _DropoutNet()
    modes: list[bool] = []
    student.dropout.register_forward_hook(lambda m, *_: modes.append(m.training))
    data = TrainData({"x": np.ones((8, 4), dtype=np.float32)}, batch_size=4)
    distill(student, teacher, data, DistillSettings(epochs=1, objective=objective))
    assert modes == [dropout_active] * 2
    assert student.linear.training is False  # handed back in eval mode


def test_learning_rate_falls_every_batch_to_zero_at_the_end(monkeypatch: Any) -> None:
    rates: list[float] = []
    step = torch.optim.AdamW.step

    def record(self: torch.optim.AdamW, *args: Any, **kwargs: Any) -> Any:
        rates.append(self.param_groups[0]["lr"])
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.AdamW, "step", record)
    data = TrainData({"x": np.ones((16, 4), dtype=np.float32)}, batch_size=4)
    distill(_DropoutNet(), _DropoutNet(), data, DistillSettings(epochs=2, lr=1e-3))
    assert len(rates) == 8 and rates[0] == pytest.approx(1e-3)
    assert all(a > b for a, b in itertools.pairwise(rates))
    assert rates[-1] < 0.05 * 1e-3
