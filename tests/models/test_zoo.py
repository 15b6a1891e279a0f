from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from turboinfer.models import ResolvedModel, list_models, resnet
from turboinfer.models import minilm as minilm_entry
from turboinfer.models.zoo import RunFn, get_entry

OrtRunner = Callable[[Path], RunFn]


def _torch_module(model: ResolvedModel) -> torch.nn.Module:
    factory = model.artifact.torch_module
    assert callable(factory)
    module = factory()
    assert isinstance(module, torch.nn.Module) and not module.training
    return module


def test_zoo_lists_the_builtins_with_consistent_signatures() -> None:
    entries = list_models()
    assert [e.name for e in entries] == ["digits-cnn", "digits-dsconv", "minilm", "resnet18",
                                         "resnet50"]
    for entry in entries:
        feeds = entry.example_inputs(3)
        assert tuple(feeds) == entry.input_names
        assert all(len(value) == 3 for value in feeds.values())
        assert set(entry.dynamic_axes) >= set(entry.input_names)
    assert [e.random_weights for e in entries] == [False, False, False, True, True]


def test_digits_reaches_95_percent_through_onnx_runtime(
    digits: ResolvedModel, ort_run: OrtRunner
) -> None:
    assert digits.entry is not None
    evalset = digits.entry.evaluation()
    assert len(evalset) == 450  # the fixed 25% held-out split of 1797 images
    accuracy = digits.entry.metric.compute(ort_run(digits.artifact.onnx_path), evalset)
    assert accuracy >= 95.0
    calibration = digits.entry.calibration(100)["input"]
    assert calibration.shape == (100, 1, 8, 8) and calibration.dtype == np.float32


def test_minilm_export_matches_pytorch(minilm: ResolvedModel, ort_run: OrtRunner) -> None:
    module, run = _torch_module(minilm), ort_run(minilm.artifact.onnx_path)
    texts = minilm_entry.evaluation_sentences()
    for batch, length in ((1, 16), (7, None)):  # None: padded to the batch's longest
        feeds = minilm_entry.tokenize(texts[:batch], length)
        with torch.no_grad():
            expected = module(*(torch.from_numpy(feeds[n]) for n in minilm.entry.input_names))
        got = run(feeds)["embeddings"]
        assert got.shape == (batch, 384)
        cosine = (got * expected.numpy()).sum(axis=1)  # both are unit vectors
        assert cosine.min() > 0.9999, (batch, length)


def test_minilm_data_and_metric(minilm: ResolvedModel, ort_run: OrtRunner) -> None:
    entry = minilm.entry
    assert entry is not None
    assert len(minilm_entry.sentences()) >= 300
    example = entry.example_inputs(4)
    assert example["input_ids"].shape == (4, 128) and example["input_ids"].dtype == np.int64
    assert entry.calibration(10)["attention_mask"].shape[0] == 10
    evalset = entry.evaluation()
    assert evalset.labels is not None and evalset.labels.shape == (len(evalset), 384)
    assert entry.metric.compute(ort_run(minilm.artifact.onnx_path), evalset) > 0.9999


def test_resnet18_export_matches_pytorch(resnet18: ResolvedModel, ort_run: OrtRunner) -> None:
    module, run = _torch_module(resnet18), ort_run(resnet18.artifact.onnx_path)
    for batch in (1, 3):
        images = resnet.random_images(batch, seed=100 + batch)
        with torch.no_grad():
            expected = module(torch.from_numpy(images)).numpy()
        got = run({"input": images})["logits"]
        assert got.shape == (batch, 1000)
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-3)


def test_resnet18_agrees_with_its_reference(resnet18: ResolvedModel, ort_run: OrtRunner) -> None:
    assert resnet18.entry is not None
    evalset = resnet18.entry.evaluation()
    assert evalset.labels is not None and len(set(evalset.labels.tolist())) > 10
    agreement = resnet18.entry.metric.compute(ort_run(resnet18.artifact.onnx_path), evalset)
    assert agreement >= 95.0


@pytest.mark.parametrize(
    ("build", "millions"), [(resnet.resnet18, 11.69), (resnet.resnet50, 25.56)]
)
def test_resnet_parameter_counts(build: Callable[[], torch.nn.Module], millions: float) -> None:
    count = sum(p.numel() for p in build().parameters())
    assert count / 1e6 == pytest.approx(millions, abs=0.01)


def test_resnet_batchnorm_is_not_an_identity(resnet18: ResolvedModel) -> None:
    bn = _torch_module(resnet18).layer2[0].bn1
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))
    assert get_entry("resnet50").metric.name == "top1-agreement"
