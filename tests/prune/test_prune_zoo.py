from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.models.zoo import get_entry
from turboinfer.prune.data import load_text
from turboinfer.prune.zoo import halves, task_for


def test_halves_split_only_longer_sentences() -> None:
    assert halves(("one two three four five six seven", "too short")) == (
        "one two three", "four five six seven")


def test_digits_task_trains_on_the_training_split_only() -> None:
    task = task_for(get_entry("digits-cnn"), batch_size=32)
    evaluation = get_entry("digits-cnn").evaluation().inputs["input"]
    train = task.train_data.inputs["input"]
    assert len(train) + len(evaluation) == 1797  # all of scikit-learn's digits, split
    assert not any(np.array_equal(train[0], image) for image in evaluation)
    inputs, labels = next(iter(task.train_data))
    assert inputs[0].shape == (32, 1, 8, 8) and labels is not None and labels.shape == (32,)


def test_text_file_without_sentences_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", "utf-8")
    with pytest.raises(InvalidInputError, match="has no sentences"):
        load_text(empty)
    with pytest.raises(ConfigError, match="does not exist"):
        load_text(tmp_path / "missing.txt")


@pytest.mark.slow
def test_minilm_loses_heads_and_ffn_channels_and_still_exports(tmp_path: Path) -> None:
    import onnxruntime as ort

    from turboinfer.prune.measure import LatencySettings
    from turboinfer.prune.pipeline import prune_model
    from turboinfer.prune.settings import DistillSettings, PruneSettings

    settings = PruneSettings(target_sparsity=0.3, taylor_batches=1, batch_size=16,
                             distill=DistillSettings(epochs=0))
    report = prune_model("builtin:minilm", settings, tmp_path,
                           latency=LatencySettings(rounds=1, seconds_per_round=0.0))
    data = report.to_dict()
    assert data["attention_heads"]["after"] == [8] * 6  # ceil(0.3 * 12) heads cut per layer
    ffn = [r for r in data["layers"] if r["name"].endswith("intermediate.dense")]
    assert all(r["out_after"] == 1075 for r in ffn)
    feeds = get_entry("minilm").example_inputs(2)
    out = ort.InferenceSession(data["files"]["onnx"]).run(None, feeds)[0]
    assert out.shape == (2, 384)


def test_prune_for_tune_returns_the_onnx_and_the_entrys_metric(tmp_path: Path) -> None:
    from turboinfer.prune import DistillSettings, PruneSettings, prune_for_tune
    from turboinfer.prune.measure import LatencySettings

    pruned = prune_for_tune("builtin:digits-cnn",
                            PruneSettings(distill=DistillSettings(epochs=1)), tmp_path,
                            latency=LatencySettings(rounds=1, seconds_per_round=0.0))
    assert pruned.onnx_path.is_file() and pruned.report_path.is_file()
    assert pruned.metric_name == "accuracy"
    assert pruned.metric is not None and pruned.metric_before is not None
    assert pruned.metric > 90 and pruned.metric_before > 95
