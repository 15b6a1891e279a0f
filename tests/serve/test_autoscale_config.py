from pathlib import Path

import pytest

from turboinfer.errors import ConfigError
from turboinfer.serve.config import AutoscalingConfig, ModelConfig, dump_config, load_config


def test_autoscaling_defaults_follow_the_issue() -> None:
    config = ModelConfig()
    assert config.autoscaling == AutoscalingConfig()
    assert not config.autoscaling.enabled
    assert config.autoscaling.scale_up_cpu_utilization == 0.70
    assert config.autoscaling.scale_down_rate_qps == 5.0
    assert config.autoscaling.max_instances is None
    assert config.idle_unload_s is None


def test_autoscaling_and_idle_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("autoscaling:\n  enabled: true\n  min_instances: 1\n  max_instances: 2\n"
                    "  scale_up_window_s: 2\n  cooldown_s: 1.5\nidle_unload_s: 60\n")
    config = load_config(path)
    assert config.autoscaling.enabled and config.autoscaling.max_instances == 2
    assert config.autoscaling.scale_up_window_s == 2.0
    assert config.autoscaling.cooldown_s == 1.5
    assert config.idle_unload_s == 60.0
    dump_config(config, path)
    assert load_config(path) == config


@pytest.mark.parametrize("text, key", [
    ("autoscaling: {min_instances: 3, max_instances: 2}\n", "autoscaling"),
    ("autoscaling: {scale_up_cpu_utilization: 1.5}\n", "autoscaling.scale_up_cpu_utilization"),
    ("autoscaling: {min_instances: 0}\n", "autoscaling.min_instances"),
    ("autoscaling: {cooldown: 5}\n", "autoscaling.cooldown"),
    ("idle_unload_s: 0\n", "idle_unload_s"),
])
def test_invalid_autoscaling_names_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert key in str(info.value)
