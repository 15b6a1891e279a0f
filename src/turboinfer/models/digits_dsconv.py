"""``digits-dsconv``: a depthwise-separable CNN on the digits, hard for post-training INT8.

MobileNet's blocks (a depthwise 3x3 conv, then a pointwise 1x1 conv, each with
BatchNorm and ReLU), trained on scikit-learn's digits like ``digits-cnn``. After training,
the channels between each depthwise and pointwise conv are spread over a wide range of
scales (BatchNorm's scale and shift times a factor per channel, the pointwise weights
divided by it): the model computes exactly the same function, but its activations and
weights have the per-tensor-unfriendly ranges that depthwise layers are known to grow,
so every post-training calibration loses accuracy on it. It is the zoo's case for
quantization-aware training.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from turboinfer.models import digits
from turboinfer.models.weights import cached_state_dict
from turboinfer.models.zoo import ZooEntry

VERSION = "3"
# Scales of the channels between depthwise and pointwise convs, log-uniform over this
# range (seeded): the largest channel sets a per-tensor activation range the smallest
# ones cannot use. At 1-500 MinMax, Entropy and Percentile INT8 lose 50, 17 and 35 points
# of 99.1; at 1-200 Entropy kept within 0.25 points.
CHANNEL_SCALE_RANGE = (1.0, 500.0)


def _block(channels: int, out: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False),
        nn.BatchNorm2d(channels),
        nn.ReLU(),
        nn.Conv2d(channels, out, 1, bias=False),
        nn.BatchNorm2d(out),
        nn.ReLU(),
    )


class DigitsDSConv(nn.Module):
    """Input ``[N, 1, 8, 8]`` float32 (standardized) → logits ``[N, 10]``."""

    def __init__(self) -> None:
        super().__init__()
        # Wide enough that INT8 pays on a CPU (at 32-64 channels QDQ cost more than it saved).
        self.stem = nn.Sequential(nn.Conv2d(1, 64, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(64), nn.ReLU())
        self.blocks = nn.Sequential(_block(64, 128), _block(128, 256), _block(256, 256))
        self.classifier = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def spread_channels(model: DigitsDSConv, seed: int = 0) -> DigitsDSConv:
    """Scale each depthwise output channel by a factor and its pointwise input by 1/factor.

    ReLU is positively homogeneous, so ``relu(s * x) / s == relu(x)`` for ``s > 0``: the
    function is unchanged, only its ranges spread.
    """
    rng = np.random.default_rng(seed)
    low, high = np.log(CHANNEL_SCALE_RANGE[0]), np.log(CHANNEL_SCALE_RANGE[1])
    with torch.no_grad():
        for block in model.blocks:
            norm, pointwise = list(block.children())[1], list(block.children())[3]
            assert isinstance(norm, nn.BatchNorm2d) and isinstance(pointwise, nn.Conv2d)
            scale = torch.from_numpy(np.exp(rng.uniform(low, high, norm.num_features)))
            scale = scale.to(norm.weight.dtype)
            norm.weight.mul_(scale)
            norm.bias.mul_(scale)
            pointwise.weight.div_(scale[None, :, None, None])
    return model


def _train(model: DigitsDSConv) -> DigitsDSConv:
    return spread_channels(digits.train(model))


def build() -> DigitsDSConv:
    return cached_state_dict(f"digits-dsconv-v{VERSION}", DigitsDSConv(), _train)


ENTRY = ZooEntry(
    name="digits-dsconv",
    description=(
        "depthwise-separable CNN trained on the 8x8 digits, its channel ranges spread "
        "(same function): hard for post-training INT8; metric is held-out accuracy"
    ),
    build=build,
    example_inputs=digits.example_inputs,
    calibration=digits.calibration,
    evaluation=digits.evaluation,
    metric=digits.ENTRY.metric,
    input_names=digits.ENTRY.input_names,
    output_names=digits.ENTRY.output_names,
    dynamic_axes=digits.ENTRY.dynamic_axes,
    version=VERSION,
)
