from pathlib import Path

import pytest

from turboinfer.errors import ConfigError
from turboinfer.serve.config import (
    DynamicBatching,
    ModelConfig,
    VersionPolicy,
    dump_config,
    load_config,
    write_entry,
)


def test_round_trip(tmp_path: Path) -> None:
    config = ModelConfig(max_batch_size=16,
                         dynamic_batching=DynamicBatching(max_queue_delay_ms=2.5,
                                                          preferred_batch_sizes=(8, 16)),
                         instances=2)
    path = tmp_path / "config.yaml"
    dump_config(config, path)
    assert load_config(path) == config
    assert load_config(tmp_path / "absent.yaml") == ModelConfig()


@pytest.mark.parametrize("text, key", [
    ("max_batch_size: -1\n", "max_batch_size"),
    ("engine: tvm\n", "engine"),
    ("dynamic_batching: {max_queue_delay_ms: fast}\n", "dynamic_batching.max_queue_delay_ms"),
    ("max_batch_sise: 8\n", "max_batch_sise"),
    ("version_policy: {latest: 2, all: true}\n", "version_policy"),
])
def test_invalid_config_names_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and key in str(info.value)


def test_broken_yaml(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("engine: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_version_policy() -> None:
    assert VersionPolicy().select([1, 3, 2]) == [3]
    assert VersionPolicy(latest=2).select([1, 3, 2]) == [3, 2]
    assert VersionPolicy(all=True).select([1, 2]) == [2, 1]
    assert VersionPolicy(specific=(1,)).select([1, 2]) == [1]


def test_write_entry_numbers_versions(tmp_path: Path, linear_onnx: Path) -> None:
    repo = tmp_path / "repo"
    first = write_entry(repo, "linear", linear_onnx, ModelConfig(max_batch_size=8))
    second = write_entry(repo, "linear", linear_onnx, ModelConfig(max_batch_size=8))
    assert first.name == "1" and second.name == "2"
    assert (second / "model.onnx").read_bytes() == linear_onnx.read_bytes()
    assert load_config(repo / "linear" / "config.yaml").max_batch_size == 8
    assert sorted(p.name for p in (repo / "linear").iterdir()) == ["1", "2", "config.yaml"]
