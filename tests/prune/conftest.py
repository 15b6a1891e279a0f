"""Small models and data for the pruning tests: fast enough to prune many times."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

from turboinfer.prune.data import TrainData
from turboinfer.prune.settings import DistillSettings, PruneSettings


@pytest.fixture(autouse=True, scope="package")
def _one_torch_thread() -> Iterator[None]:
    """These models are too small to split across cores, and on a busy machine two
    spinning OpenMP threads made each convolution ten times slower than one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class TinyNet(nn.Module):
    """``[N, 3, 8, 8]`` → ``[N, 5]``: two conv blocks and a classifier, like digits-cnn."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv = nn.Conv2d(16, 32, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(32)
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.stem(x)))
        x = torch.relu(self.bn2(self.conv(x)))
        return self.head(x.mean(dim=(2, 3)))


class FixedReshapeNet(TinyNet):
    """Flattens to a width written into the code: pruning ``conv`` breaks its forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn2(self.conv(torch.relu(self.bn1(self.stem(x))))))
        return self.head(x.mean(dim=(2, 3)).reshape(-1, 32))


@pytest.fixture
def tiny_net() -> TinyNet:
    torch.manual_seed(0)
    return TinyNet().eval()


@pytest.fixture
def fixed_reshape_net() -> FixedReshapeNet:
    return FixedReshapeNet().eval()


@pytest.fixture
def tiny_inputs() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((64, 3, 8, 8)).astype(np.float32)


@pytest.fixture
def tiny_data(tiny_inputs: np.ndarray) -> TrainData:
    labels = np.random.default_rng(1).integers(0, 5, len(tiny_inputs)).astype(np.int64)
    return TrainData({"x": tiny_inputs}, labels, batch_size=16)


@pytest.fixture
def example(tiny_inputs: np.ndarray) -> tuple[torch.Tensor, ...]:
    return (torch.from_numpy(tiny_inputs[:2]),)


@pytest.fixture
def quick_settings() -> PruneSettings:
    return PruneSettings(target_sparsity=0.5, taylor_batches=2, distill=DistillSettings(epochs=1))
