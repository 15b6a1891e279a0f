"""``resnet18`` and ``resnet50``: the torchvision architectures with seeded random weights.

The module and parameter names match torchvision's, so its pretrained state_dicts load
as they are; torchvision itself is not a dependency (its PyPI wheel does not import
beside every torch build). With random weights there is no accuracy to claim, so the
metric is top-1 agreement with the FP32 PyTorch model on seeded random images: it says
how far an optimized variant strays from the model it came from.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from torch import nn

from turboinfer.models import metrics
from turboinfer.models.weights import cached_array, cached_state_dict
from turboinfer.models.zoo import EvalSet, Feeds, Metric, ZooEntry

VERSION = "1"
IMAGE_SHAPE = (3, 224, 224)
EVAL_IMAGES = 64
# Distinct seeds keep example, calibration and evaluation images apart.
_SEED_WEIGHTS, _SEED_EXAMPLE, _SEED_CALIBRATION, _SEED_EVAL = 0, 1, 2, 3


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(inplanes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """ResNet v1.5: the stride sits on the 3x3 conv, as in torchvision."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = _downsample(inplanes, planes * self.expansion, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        identity = x if self.downsample is None else self.downsample(x)
        return self.relu(out + identity)


def _downsample(inplanes: int, outplanes: int, stride: int) -> nn.Sequential | None:
    if stride == 1 and inplanes == outplanes:
        return None
    return nn.Sequential(
        nn.Conv2d(inplanes, outplanes, 1, stride, bias=False), nn.BatchNorm2d(outplanes)
    )


Block = type[BasicBlock] | type[Bottleneck]


class ResNet(nn.Module):
    """Input ``[N, 3, 224, 224]`` float32 → logits ``[N, num_classes]``."""

    def __init__(self, block: Block, layers: list[int], num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._stage(block, 64, layers[0], 1)
        self.layer2 = self._stage(block, 128, layers[1], 2)
        self.layer3 = self._stage(block, 256, layers[2], 2)
        self.layer4 = self._stage(block, 512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512 * block.expansion, num_classes)

    def _stage(self, block: Block, planes: int, blocks: int, stride: int) -> nn.Sequential:
        layers = [block(self.inplanes, planes, stride)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, 3, H, W] -> [N, classes]
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18() -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50() -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3])


def seeded_weights(model: ResNet, seed: int = _SEED_WEIGHTS) -> ResNet:
    """Give ``model`` reproducible random weights with realistic BatchNorm state.

    Fresh BatchNorm (gamma 1, beta 0, mean 0, var 1) is an identity that makes Conv+BN
    fusion a no-op and lets activations grow layer by layer. Random gamma/beta plus
    running statistics measured on seeded images give every BN real work and keep the
    eval-mode activations at a sane scale.
    """
    generator = torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.normal_(m.bias, 0.0, 0.1)
            m.momentum = None  # cumulative average over the passes below
    # Small gammas on each block's last BN, as training tends to leave them: a random
    # residual net with unit gammas is chaotic, flipping its arg-max under any rounding.
    for block in model.modules():
        if isinstance(block, BasicBlock | Bottleneck):
            last = block.bn3 if isinstance(block, Bottleneck) else block.bn2
            nn.init.uniform_(last.weight, 0.05, 0.2)
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(8, *IMAGE_SHAPE, generator=generator))
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = 0.1
    _standardize_classifier(model.eval(), torch.randn(16, *IMAGE_SHAPE, generator=generator))
    return model


def _standardize_classifier(model: ResNet, images: torch.Tensor, scale: float = 2.0) -> None:
    """Make the logits depend on the image, with a spread of about ``scale``.

    Pooled features of a random network share a large common component, so a random
    classifier picks the same class for every input and top-1 agreement says nothing.
    Cancelling the mean through the bias and scaling by the image-to-image spread makes
    the arg-max vary from image to image.
    """
    with torch.no_grad():
        x = model.maxpool(model.relu(model.bn1(model.conv1(images))))
        x = model.layer4(model.layer3(model.layer2(model.layer1(x))))
        features = torch.flatten(model.avgpool(x), 1)  # [N, C]
        mean = features.mean(0)
        spread = (features - mean).norm(dim=1).mean().clamp(min=1e-6)
        model.fc.weight.copy_(torch.randn_like(model.fc.weight) * scale / spread)
        model.fc.bias.copy_(-(model.fc.weight @ mean))


def random_images(count: int, seed: int) -> np.ndarray:
    """``[count, 3, 224, 224]`` float32 standard-normal images, the same for the same seed."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((count, *IMAGE_SHAPE), dtype=np.float32)


def _top1(model: ResNet, images: np.ndarray, batch: int = 16) -> np.ndarray:
    with torch.no_grad():
        chunks = [
            model(torch.from_numpy(images[i : i + batch])).argmax(dim=1).numpy()
            for i in range(0, len(images), batch)
        ]
    return np.concatenate(chunks).astype(np.int64)


def _entry(name: str, arch: Callable[[], ResNet], what: str) -> ZooEntry:
    key = f"{name}-v{VERSION}"

    def build() -> ResNet:
        return cached_state_dict(key, arch(), seeded_weights)

    def evaluation() -> EvalSet:
        images = random_images(EVAL_IMAGES, _SEED_EVAL)
        # The FP32 PyTorch model's classes are the labels: the metric is agreement.
        reference = cached_array(f"{key}-top1", lambda: _top1(build(), images))
        return EvalSet(inputs={"input": images}, labels=reference)

    def example_inputs(batch: int) -> Feeds:
        return {"input": random_images(batch, _SEED_EXAMPLE)}

    def calibration(count: int) -> Feeds:
        return {"input": random_images(count, _SEED_CALIBRATION)}

    return ZooEntry(
        name=name,
        description=(
            f"{what} (torchvision architecture), seeded random weights; inputs are seeded "
            "random normal images, metric is top-1 agreement with the FP32 PyTorch model"
        ),
        build=build,
        example_inputs=example_inputs,
        calibration=calibration,
        evaluation=evaluation,
        metric=Metric(
            name="top1-agreement",
            compute=partial(metrics.accuracy, output="logits"),
            higher_is_better=True,
            unit="points",
        ),
        input_names=("input",),
        output_names=("logits",),
        dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        random_weights=True,
        version=VERSION,
    )


RESNET18 = _entry("resnet18", resnet18, "ResNet-18 image classifier, 1000 classes")
RESNET50 = _entry("resnet50", resnet50, "ResNet-50 (v1.5) image classifier, 1000 classes")
