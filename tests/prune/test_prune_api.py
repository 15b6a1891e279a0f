from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from turboinfer.errors import ConfigError, InvalidInputError, ModelLoadError
from turboinfer.models.export import export_onnx
from turboinfer.prune.api import prune
from turboinfer.prune.data import TrainData
from turboinfer.prune.settings import Protect, PruneSettings


def test_pruned_model_runs_exports_and_keeps_protected_shapes(
    tiny_net: Any, tiny_data: TrainData, example: tuple[torch.Tensor, ...],
    quick_settings: PruneSettings, tmp_path: Path,
) -> None:
    stem_shape, head_shape = tiny_net.stem.weight.shape, tiny_net.head.weight.shape
    result = prune(tiny_net, example, tiny_data, lambda m: 0.0, quick_settings)
    model = result.model
    assert result.protected == ["stem", "head"]
    assert model.stem.weight.shape == stem_shape  # first layer: untouched
    assert model.head.out_features == head_shape[0]  # last layer: same outputs
    assert model.conv.out_channels == 16 and model.head.in_features == 16
    assert result.size_after.macs < result.size_before.macs
    path = export_onnx(model, {"x": example[0]}, tmp_path / "p.onnx", input_names=["x"],
                       output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    batch = np.random.default_rng(2).standard_normal((3, 3, 8, 8)).astype(np.float32)
    got = ort.InferenceSession(str(path)).run(None, {"x": batch})[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(torch.from_numpy(batch)).numpy(), atol=1e-4)


def test_without_protection_the_first_layer_is_pruned_too(
    tiny_net: Any, tiny_data: TrainData, example: tuple[torch.Tensor, ...],
) -> None:
    settings = PruneSettings(target_sparsity=0.5, protect=frozenset({Protect.LAST}))
    settings = settings.__class__(**{**settings.__dict__, "distill": settings.distill.__class__(
        epochs=0)})
    result = prune(tiny_net, example, tiny_data, None, settings)
    assert result.model.stem.out_channels == 8
    assert result.metrics.before is None and result.distill_losses == []


def test_metric_is_taken_at_every_stage(
    tiny_net: Any, tiny_data: TrainData, example: tuple[torch.Tensor, ...],
    quick_settings: PruneSettings,
) -> None:
    seen: list[int] = []

    def eval_fn(model: nn.Module) -> float:
        seen.append(sum(p.numel() for p in model.parameters()))
        return float(len(seen))

    result = prune(tiny_net, example, tiny_data, eval_fn, quick_settings)
    assert (result.metrics.before, result.metrics.pruned, result.metrics.distilled) == (1, 2, 3)
    assert seen[0] > seen[1] == seen[2]  # evaluated before, then twice at the pruned size


def test_model_broken_by_pruning_is_named(
    fixed_reshape_net: nn.Module, tiny_data: TrainData, example: tuple[torch.Tensor, ...],
    quick_settings: PruneSettings,
) -> None:
    with pytest.raises(ModelLoadError, match="cannot prune FixedReshapeNet"):
        prune(fixed_reshape_net, example, tiny_data, None, quick_settings)


def test_model_returning_no_tensor_is_named(
    tiny_net: Any, tiny_data: TrainData, example: tuple[torch.Tensor, ...],
    quick_settings: PruneSettings,
) -> None:
    class DictOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = tiny_net

        def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"logits": self.inner(x)}

    with pytest.raises(InvalidInputError, match="must return one tensor"):
        prune(DictOut().eval(), example, tiny_data, None, quick_settings)


def test_nothing_to_prune_is_named(tiny_data: TrainData, quick_settings: PruneSettings) -> None:
    model = nn.Sequential(nn.Flatten(), nn.Linear(192, 5)).eval()
    with pytest.raises(ConfigError, match="nothing to prune"):
        prune(model, (torch.zeros(2, 3, 8, 8),), tiny_data, None, quick_settings)


def test_training_data_of_the_wrong_shape_is_named(
    tiny_net: Any, example: tuple[torch.Tensor, ...], quick_settings: PruneSettings,
) -> None:
    data = TrainData({"x": np.zeros((8, 4, 8, 8), np.float32)}, None)
    with pytest.raises(InvalidInputError, match=r"training data does not fit .*\[8, 4, 8, 8\]"):
        prune(tiny_net, example, data, None, quick_settings)


def test_labels_beyond_the_model_outputs_are_named(
    tiny_net: Any, tiny_inputs: np.ndarray, example: tuple[torch.Tensor, ...],
    quick_settings: PruneSettings,
) -> None:
    data = TrainData({"x": tiny_inputs}, np.full(len(tiny_inputs), 7, np.int64))
    with pytest.raises(InvalidInputError, match=r"labels run from 7 to 7 .* 5 outputs"):
        prune(tiny_net, example, data, None, quick_settings)


def test_arrays_of_different_lengths_are_refused(tiny_inputs: np.ndarray) -> None:
    with pytest.raises(InvalidInputError, match="differ in sample count"):
        TrainData({"x": tiny_inputs}, np.zeros(3, np.int64))


def test_semi_structured_pattern_survives_distillation(
    tiny_net: Any, tiny_data: TrainData, example: tuple[torch.Tensor, ...],
) -> None:
    settings = PruneSettings(target_sparsity=0.5, semi_structured=True, taylor_batches=2)
    result = prune(tiny_net, example, tiny_data, lambda m: 1.0, settings)
    assert result.zero_fraction == 0.5 and result.metrics.semi_structured == 1.0
    conv = result.model.conv.weight.detach()  # not protected: masked, then trained 10 epochs
    assert ((conv.reshape(conv.shape[0], -1, 4) != 0).sum(dim=-1) == 2).all()
    assert result.dense_model is not None
    assert (result.dense_model.conv.weight != 0).float().mean() > 0.9
