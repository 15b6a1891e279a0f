"""A user's own CNN, named ``user_cnn:make_cnn`` in the pruning tests.

Trained on scikit-learn's digits the first time it is built in a process (a second or
two), so that pruning it has an accuracy to keep.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from turboinfer.models import digits


class UserCNN(nn.Module):
    """``[N, 1, 8, 8]`` → ``[N, 10]``: three conv blocks and a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        )
        self.head = nn.Linear(32, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(image).mean(dim=(2, 3)))


@cache
def _trained_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = UserCNN()
    split = digits.data()
    x, y = torch.from_numpy(split.train_x), torch.from_numpy(split.train_y)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(15):
        for index in torch.randperm(len(x), generator=generator).split(64):
            loss = nn.functional.cross_entropy(model(x[index]), y[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def make_cnn() -> nn.Module:
    model = UserCNN()
    model.load_state_dict(_trained_state())
    return model.eval()


def write_data(folder: Path) -> tuple[Path, Path]:
    """The digits split as a user hands it over: ``train.npz`` and ``eval.npz``."""
    split = digits.data()
    train, held = folder / "train.npz", folder / "eval.npz"
    np.savez(train, image=split.train_x, labels=split.train_y)
    np.savez(held, image=split.test_x, labels=split.test_y)
    return train, held
