from __future__ import annotations

import pytest

from turboinfer.errors import ConfigError
from turboinfer.prune.schedule import plan, ratio_scheduler
from turboinfer.prune.settings import Phase, PruneSettings, parse_schedule


def test_parse_schedule_reads_phases_in_order() -> None:
    assert parse_schedule("l1:0.3, Taylor:0.2") == (Phase("l1", 0.3), Phase("taylor", 0.2))


@pytest.mark.parametrize("text", ["l1", "l1:x", "magic:0.2", "l1:1.5", ","])
def test_parse_schedule_rejects_malformed_parts(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_schedule(text)


@pytest.mark.parametrize("sparsity", [0.0, 1.0, -0.1, 1.5])
def test_sparsity_outside_open_unit_interval_is_named(sparsity: float) -> None:
    with pytest.raises(ConfigError, match=r"target sparsity .* not in \(0, 1\)"):
        PruneSettings(target_sparsity=sparsity)


def test_schedule_must_add_up_to_target() -> None:
    with pytest.raises(ConfigError, match="add up"):
        PruneSettings(target_sparsity=0.5, schedule=parse_schedule("l1:0.3,taylor:0.1"))


def test_default_schedule_is_l1_then_taylor() -> None:
    phases = PruneSettings(target_sparsity=0.5).phases
    assert [p.criterion for p in phases] == ["l1", "taylor"]
    assert sum(p.amount for p in phases) == pytest.approx(0.5)


def test_plan_splits_each_phase_into_cumulative_steps() -> None:
    steps = plan(parse_schedule("l1:0.3,taylor:0.2"), steps_per_phase=2)
    assert [s.criterion for s in steps] == ["l1", "l1", "taylor", "taylor"]
    assert [s.sparsity for s in steps] == pytest.approx([0.15, 0.3, 0.4, 0.5])


def test_ratio_scheduler_scales_the_plan_to_any_ratio() -> None:
    schedule = ratio_scheduler(plan(parse_schedule("l1:0.3,taylor:0.2"), steps_per_phase=1))
    assert schedule(0.5, 2) == pytest.approx([0.0, 0.3, 0.5])
    # Head pruning asks with its own ratio: same shape, its own end point.
    assert schedule(0.25, 2) == pytest.approx([0.0, 0.15, 0.25])
