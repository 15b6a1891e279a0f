"""``digits-cnn``: a small CNN trained on scikit-learn's bundled 8x8 handwritten digits.

It is the zoo's real, trained model that needs no download: training takes a few
seconds on two cores the first time, then the weights come from the cache. The split is
fixed (stratified, seeded), so every run evaluates on the same held-out images.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, partial
from typing import TypeVar

import numpy as np
import torch
from torch import nn

from turboinfer.models import metrics
from turboinfer.models.weights import cached_state_dict
from turboinfer.models.zoo import EvalSet, Feeds, Metric, ZooEntry

VERSION = "1"
Net = TypeVar("Net", bound=nn.Module)  # any classifier of the digits: this one, digits-dsconv
_SEED = 0
_EPOCHS = 30
_BATCH = 64


class DigitsCNN(nn.Module):
    """Input ``[N, 1, 8, 8]`` float32 (standardized) → logits ``[N, 10]``."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(2),  # [N, 64, 4, 4]
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.25), nn.Linear(64 * 16, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


@dataclass(frozen=True)
class DigitsData:
    train_x: np.ndarray  # [N, 1, 8, 8] float32
    train_y: np.ndarray  # [N] int64
    test_x: np.ndarray
    test_y: np.ndarray


@cache
def data() -> DigitsData:
    """The fixed 75/25 stratified split, standardized with training statistics.

    Shared by every caller: the functions below hand out copies.
    """
    # scikit-learn takes a second to import; only digits-cnn itself needs it.
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]  # pixels are 0..16
    labels = digits.target.astype(np.int64)
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels, test_size=0.25, stratify=labels, random_state=_SEED
    )
    mean, std = float(train_x.mean()), float(train_x.std())
    train_x, test_x = (train_x - mean) / std, (test_x - mean) / std
    return DigitsData(train_x, train_y, test_x, test_y)


def train(model: Net) -> Net:
    """Seeded Adam with a one-cycle schedule; reaches ~99% held-out accuracy."""
    threads = torch.get_num_threads()
    # Ops this small gain nothing from threads, and on a busy machine a second thread
    # that waits for its turn made training many times slower.
    torch.set_num_threads(1)
    try:
        return _fit(model)
    finally:
        torch.set_num_threads(threads)


def _fit(model: Net) -> Net:
    torch.manual_seed(_SEED)
    # The model may have been built under any RNG state: start from the seed's weights.
    for layer in model.modules():
        if isinstance(layer, nn.Conv2d | nn.Linear | nn.BatchNorm2d):
            layer.reset_parameters()
    split = data()
    x, y = torch.from_numpy(split.train_x), torch.from_numpy(split.train_y)
    order = torch.Generator().manual_seed(_SEED)
    steps = _EPOCHS * -(-len(x) // _BATCH)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=steps)
    model.train()
    for _ in range(_EPOCHS):
        for index in torch.randperm(len(x), generator=order).split(_BATCH):
            loss = nn.functional.cross_entropy(model(x[index]), y[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return model.eval()


def build() -> DigitsCNN:
    return cached_state_dict(f"digits-cnn-v{VERSION}", DigitsCNN(), train)


def _cycle(images: np.ndarray, count: int) -> np.ndarray:
    """``count`` images, repeating the set when more are asked than it has."""
    return np.resize(images, (count, *images.shape[1:]))


def example_inputs(batch: int) -> Feeds:
    return {"input": _cycle(data().test_x, batch)}


def calibration(count: int) -> Feeds:
    train_x = data().train_x
    return {"input": train_x[:count].copy()}


def evaluation() -> EvalSet:
    split = data()
    return EvalSet(inputs={"input": split.test_x.copy()}, labels=split.test_y.copy())


ENTRY = ZooEntry(
    name="digits-cnn",
    description=(
        "small CNN trained on scikit-learn's 8x8 handwritten digits (trained on first use); "
        "metric is accuracy on a fixed 25% held-out split"
    ),
    build=build,
    example_inputs=example_inputs,
    calibration=calibration,
    evaluation=evaluation,
    metric=Metric(
        name="accuracy",
        compute=partial(metrics.accuracy, output="logits"),
        higher_is_better=True,
        unit="points",
    ),
    input_names=("input",),
    output_names=("logits",),
    dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
    version=VERSION,
)
