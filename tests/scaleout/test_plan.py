"""The replica plan: replicas, CPUs and Ray's autoscaling target from a repository entry."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from turboinfer.scaleout.plan import TunedPoint, plan_replicas, tuned_point
from turboinfer.serve.config import AutoscalingConfig, EngineSettingsConfig, ModelConfig


def _config(**autoscaling: object) -> ModelConfig:
    return ModelConfig(max_batch_size=8, instances=2,
                       engine_settings=EngineSettingsConfig(intra_op_threads=1),
                       autoscaling=AutoscalingConfig(**autoscaling))  # type: ignore[arg-type]


def test_fixed_replicas_without_autoscaling() -> None:
    plan = plan_replicas(_config(), usable_cores=8)
    assert (plan.min_replicas, plan.max_replicas, plan.autoscaling) == (1, 1, False)
    assert plan.ray_autoscaling_config() is None
    assert plan.cpus_per_replica == 2  # two instances of one thread
    assert plan_replicas(_config(enabled=True), 8, replicas=3).min_replicas == 3


def test_autoscaling_section_maps_to_ray() -> None:
    plan = plan_replicas(_config(enabled=True, min_instances=2, scale_up_window_s=5,
                                 scale_down_window_s=20, cooldown_s=40), usable_cores=8)
    config = plan.ray_autoscaling_config()
    assert config is not None
    # Unset max_instances: as many two-CPU replicas as the usable cores hold.
    assert (config["min_replicas"], config["max_replicas"]) == (2, 4)
    # A full batch per instance in service, at the 70% scale-up threshold.
    assert config["target_ongoing_requests"] == pytest.approx(0.7 * 8 * 2)
    assert config["upscale_delay_s"] == 5
    assert config["downscale_delay_s"] == 40  # the cool-down is the longer wait
    assert plan.max_ongoing_requests == 2 * 8 * 2


def test_tuned_throughput_and_latency_set_the_target(tmp_path: Path) -> None:
    (tmp_path / "tune").mkdir()
    (tmp_path / "tune" / "report.json").write_bytes(orjson.dumps(
        {"chosen": {"plan": {"qps": 2000.0, "p99_ms": 5.0, "max_batch_size": 8}}}))
    point = tuned_point(tmp_path)
    assert point == TunedPoint(2000.0, 5.0)
    plan = plan_replicas(_config(enabled=True), usable_cores=8, tuned=point)
    assert plan.target_ongoing_requests == pytest.approx(0.7 * 2000 * 0.005)
    assert tuned_point(tmp_path / "absent") is None


def test_unset_threads_reserve_one_core_per_instance() -> None:
    config = ModelConfig(instances=3)
    assert plan_replicas(config, usable_cores=2).cpus_per_replica == 2  # capped
    assert plan_replicas(ModelConfig(), usable_cores=16).cpus_per_replica == 1
