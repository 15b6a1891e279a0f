"""Fake quantization in torch, the way ONNX Runtime's QDQ static quantizer quantizes.

- Weights of every ``Conv*``/``Linear``: int8, symmetric (-127..127), one scale per output
  channel from the weight's own absolute maximum. BatchNorm is folded into the conv by
  the engine, which scales each output channel by a constant: per-channel symmetric
  quantization is unchanged by that, so the unfolded weight is quantized here.
- The input activation of each of those layers: 256 levels over a learned range
  ``[low, high]`` that contains 0 (the engine's asymmetric uint8/int8), started from the
  range observed on calibration batches. Gradients reach the range through the clamp
  and the step (LSQ/PACT-style); rounding passes gradients straight through.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.utils import parametrize

WEIGHT_MAX = 127  # symmetric int8 weights
LEVELS = 255  # 8-bit activations
QUANTIZED = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
QUANTIZERS = "activation_quantizers"  # where the model holds them while it trains


def round_ste(x: torch.Tensor) -> torch.Tensor:
    """Round forward, identity backward (the straight-through estimator)."""
    return x + (x.round() - x).detach()


class WeightFakeQuant(nn.Module):
    """Per-output-channel symmetric int8, as a parametrization of ``weight``."""

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(1, weight.dim()))
        scale = weight.detach().abs().amax(dim=dims, keepdim=True).clamp(min=1e-12) / WEIGHT_MAX
        return round_ste(weight / scale).clamp(-WEIGHT_MAX, WEIGHT_MAX) * scale


class ActivationFakeQuant(nn.Module):
    """256 levels over ``[low, high]``, both learned; 0 stays inside the range.

    The ends are learned as log factors of the observed ones: one learning rate then
    moves a range of 0.5 and one of 500 by the same share, and an end at 0 (after a
    ReLU) stays there.
    """

    low0: torch.Tensor
    high0: torch.Tensor

    def __init__(self, low: float, high: float) -> None:
        super().__init__()
        self.register_buffer("low0", torch.tensor(min(low, 0.0)))
        self.register_buffer("high0", torch.tensor(max(high, 1e-6)))
        self.log_low = nn.Parameter(torch.zeros(()))
        self.log_high = nn.Parameter(torch.zeros(()))

    def ends(self) -> tuple[torch.Tensor, torch.Tensor]:
        low = self.low0 * self.log_low.exp()
        return low, torch.maximum(self.high0 * self.log_high.exp(), low + 1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low, high = self.ends()
        scale = (high - low) / LEVELS
        zero = round_ste(-low / scale)
        q = torch.clamp(round_ste(x / scale) + zero, 0, LEVELS)
        return (q - zero) * scale

    def bounds(self) -> tuple[float, float]:
        low, high = self.ends()
        return float(low.detach()), float(high.detach())


def quantized_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if isinstance(m, QUANTIZED)]


# Shares of the observed range tried as each layer's starting clip, widest first.
CLIP_SHARES = (1.0, 0.8, 0.6, 0.45, 0.3, 0.2, 0.15, 0.1, 0.07, 0.05)
# The search stops once this many shares in a row did worse than the best so far (the
# error falls, then rises, as the clip narrows): on ResNet-18, digits-cnn and
# digits-dsconv the same clip in every layer as the whole scan (32 layers, optima from
# the widest share to the seventh), with 135 model forwards instead of 320.
CLIP_PATIENCE = 2
# Samples the clip search runs (shares x layers forwards): the first of the batches.
SEARCH_SAMPLES = 16


@torch.no_grad()
def observe_inputs(model: nn.Module, batches: Iterable[tuple[torch.Tensor, ...]]
                   ) -> dict[str, tuple[float, float]]:
    """Each quantized layer's starting input range, chosen by what it does to the output.

    The observed min and max over ``batches`` (MinMax) are the first candidate; for each
    layer alone, the share of that range whose 8-bit quantization moves the model's
    output least (squared error against the float output, on the first
    ``SEARCH_SAMPLES`` samples) is kept. A few large channels that
    stretch a per-tensor range (why post-training calibration fails) then give way to a
    clip where the output says so, and training moves the ends from there. A squared
    error on the activations themselves would keep the large values and lose the rest.
    """
    batches = list(batches)
    model.eval()
    observed: dict[str, tuple[float, float]] = {}
    handles = []
    for name, layer in quantized_layers(model):
        def record(_: nn.Module, args: tuple[torch.Tensor, ...], name: str = name) -> None:
            low, high = float(args[0].min()), float(args[0].max())
            old = observed.get(name, (low, high))
            observed[name] = (min(old[0], low, 0.0), max(old[1], high))
        handles.append(layer.register_forward_pre_hook(record))
    try:
        reference = [model(*inputs) for inputs in batches]
    finally:
        for handle in handles:
            handle.remove()
    layers = dict(quantized_layers(model))
    search = [tuple(t[:SEARCH_SAMPLES] for t in batches[0])] if batches else []
    targets = [r[:SEARCH_SAMPLES] for r in reference[:1]]
    return {name: _best_clip(model, layers[name], search, targets, low, high)
            for name, (low, high) in observed.items()}


def _best_clip(model: nn.Module, layer: nn.Module, batches: list[tuple[torch.Tensor, ...]],
               reference: list[torch.Tensor], low: float, high: float) -> tuple[float, float]:
    best, chosen, worse = float("inf"), (low, max(high, 1e-6)), 0
    for share in CLIP_SHARES:
        bounds = (low * share, max(high * share, 1e-6))
        handle = layer.register_forward_pre_hook(_apply(ActivationFakeQuant(*bounds)))
        try:
            error = sum(float((model(*inputs) - ref).pow(2).mean())
                        for inputs, ref in zip(batches, reference, strict=True))
        finally:
            handle.remove()
        if error < best:
            best, chosen, worse = error, bounds, 0
        else:
            worse += 1
            if worse >= CLIP_PATIENCE:
                break
    return chosen


@contextmanager
def fake_quantized(model: nn.Module, ranges: dict[str, tuple[float, float]]
                   ) -> Iterator[dict[str, ActivationFakeQuant]]:
    """``model`` with weight and input fake quantization on every conv/linear layer.

    Yields the activation quantizers by layer name; they are registered on the model
    (under ``QUANTIZERS``) so that its ``parameters()`` include the ranges. On exit the
    model is float again, its weights as trained.
    """
    quantizers = {name: ActivationFakeQuant(*ranges[name]) for name in ranges}
    handles = []
    layers = quantized_layers(model)
    for name, layer in layers:
        parametrize.register_parametrization(layer, "weight", WeightFakeQuant())
        if name in quantizers:
            handles.append(layer.register_forward_pre_hook(_apply(quantizers[name])))
    model.add_module(QUANTIZERS, nn.ModuleDict(
        {name.replace(".", "_") or "root": q for name, q in quantizers.items()}))
    try:
        yield quantizers
    finally:
        for handle in handles:
            handle.remove()
        delattr(model, QUANTIZERS)
        for _, layer in layers:
            parametrize.remove_parametrizations(layer, "weight", leave_parametrized=False)


def bake_ranges(model: nn.Module, bounds: dict[str, tuple[float, float]]) -> None:
    """Clamp each layer's input to its learned range: exported, a ``Clip`` the engine's
    MinMax calibration reads the range from."""
    for name, layer in quantized_layers(model):
        if name in bounds:
            low, high = bounds[name]
            layer.register_forward_pre_hook(_clamp(low, high))


def _apply(quantizer: ActivationFakeQuant):  # type: ignore[no-untyped-def]
    def hook(_: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return (quantizer(args[0]), *args[1:])

    return hook


def _clamp(low: float, high: float):  # type: ignore[no-untyped-def]
    def hook(_: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return (torch.clamp(args[0], low, high), *args[1:])

    return hook
