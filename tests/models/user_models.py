"""Models as a user writes them, referenced by the tests as ``user_models:FACTORY``.

The CNN brings its own ``example_inputs()``; the others need ``--example-input`` specs.
"""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.conv(image)).mean(dim=(2, 3))  # [B, 8]
        return self.head(features)  # [B, 10]


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class Eig(nn.Module):
    """Uses an op the ONNX exporter has no translation for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.eigvals(x).real


class Noisy(nn.Module):
    """Random in eval mode too: no export can match it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.rand_like(x)


def make_cnn() -> nn.Module:
    torch.manual_seed(0)
    return SmallCNN()


def example_inputs() -> dict[str, torch.Tensor]:
    return {"image": torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(1))}


def make_mlp() -> nn.Module:
    torch.manual_seed(0)
    return MLP()


def make_eig() -> nn.Module:
    return Eig()


def make_noisy() -> nn.Module:
    return Noisy()


def make_number() -> int:
    return 3
