"""Iterative structured pruning with Torch-Pruning: phases of criteria, several steps each.

Torch-Pruning's DepGraph finds every layer that must lose a channel together (a conv,
its BatchNorm, the next layer's inputs, residual partners); this module only decides
how much goes at each step and which criterion ranks the channels at that step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from turboinfer.errors import ModelLoadError
from turboinfer.prune.data import Batch
from turboinfer.prune.importance import CRITERIA, LossFn, accumulate_gradients
from turboinfer.prune.requires import torch_pruning
from turboinfer.prune.settings import Phase, PruneSettings

if TYPE_CHECKING:  # annotations only: the module is optional (the prune extra)
    import torch_pruning as tp


@dataclass(frozen=True)
class Step:
    criterion: str
    sparsity: float  # cumulative fraction of the original channels removed after this step


def plan(phases: Sequence[Phase], steps_per_phase: int) -> list[Step]:
    """Each phase's amount split evenly over its steps, as cumulative targets."""
    steps, done = [], 0.0
    for phase in phases:
        for _ in range(steps_per_phase):
            done += phase.amount / steps_per_phase
            steps.append(Step(phase.criterion, done))
    return steps


def ratio_scheduler(steps: Sequence[Step]) -> Callable[[float, int], list[float]]:
    """Torch-Pruning's scheduler hook: per-step ratios for any final ratio it is given.

    It is called for the channel ratio and for the head ratio alike, so the plan is kept
    as fractions of the target and scaled by whichever ratio is asked for.
    """
    target = steps[-1].sparsity
    fractions = [0.0] + [s.sparsity / target for s in steps]

    def schedule(ratio: float, count: int) -> list[float]:
        return [ratio * f for f in fractions]

    return schedule


@dataclass(frozen=True)
class PrunerSpec:
    """What the model type adds to a pruner: protected layers, attention heads."""

    ignored: list[torch.nn.Module]
    num_heads: dict[torch.nn.Module, int] = field(default_factory=dict)
    after_step: Callable[[tp.pruner.MetaPruner], None] | None = None


def build_pruner(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    settings: PruneSettings,
    spec: PrunerSpec,
) -> tuple[tp.pruner.MetaPruner, list[Step]]:
    steps = plan(settings.phases, settings.steps_per_phase)
    tp_module = torch_pruning()
    first = CRITERIA[steps[0].criterion].make()
    try:
        pruner = tp_module.pruner.MetaPruner(
            model,
            example_inputs,
            importance=first,
            pruning_ratio=settings.target_sparsity,
            iterative_steps=len(steps),
            iterative_pruning_ratio_scheduler=ratio_scheduler(steps),
            ignored_layers=spec.ignored,
            round_to=settings.round_to if settings.round_to > 1 else None,
            num_heads=dict(spec.num_heads),
            prune_num_heads=bool(spec.num_heads),
            prune_head_dims=not spec.num_heads,
            head_pruning_ratio=settings.target_sparsity if spec.num_heads else 0.0,
        )
    except Exception as exc:  # Torch-Pruning raises anything from its tracer
        raise ModelLoadError(
            f"Torch-Pruning cannot trace {type(model).__name__}: {_first_line(exc)}"
        ) from None
    if spec.num_heads:
        # Torch-Pruning removes ceil(cumulative ratio × heads left) heads at every step,
        # which compounds: 4 steps toward 50% leave 1 head of 4. Heads therefore go in
        # one cut at the last step (ranked by the last criterion), channels iteratively.
        pruner.per_step_head_pruning_ratio = [0.0] * len(steps) + [settings.target_sparsity]
    return pruner, steps


def run_steps(
    model: torch.nn.Module,
    teacher: torch.nn.Module,
    pruner: tp.pruner.MetaPruner,
    steps: Sequence[Step],
    *,
    spec: PrunerSpec,
    taylor_batches: Sequence[Batch],
    loss_fn: LossFn,
) -> None:
    """Prune step by step; each Taylor step ranks with fresh gradients of the pruned model.

    A forward that fails between steps means the model's code does not follow the new
    widths (a reshape to fixed sizes, say), which is named like a failed trace.
    """
    try:
        _run(model, teacher, pruner, steps, spec, taylor_batches, loss_fn)
    except Exception as exc:  # whatever the model's own forward raises on the new widths
        raise _inconsistent(model, exc) from None


def _run(
    model: torch.nn.Module,
    teacher: torch.nn.Module,
    pruner: tp.pruner.MetaPruner,
    steps: Sequence[Step],
    spec: PrunerSpec,
    taylor_batches: Sequence[Batch],
    loss_fn: LossFn,
) -> None:
    for step in steps:
        criterion = CRITERIA[step.criterion]
        pruner.importance = criterion.make()
        if criterion.needs_gradients:
            accumulate_gradients(model, teacher, taylor_batches, loss_fn)
        pruner.step()
        model.zero_grad(set_to_none=True)
        if spec.after_step is not None:
            spec.after_step(pruner)


def check_runs(model: torch.nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> None:
    """A pruned model whose forward breaks (a reshape to fixed sizes, say) is named here."""
    try:
        with torch.no_grad():
            model.eval()(*example_inputs)
    except Exception as exc:  # whatever the model's own code raises on the new widths
        raise _inconsistent(model, exc) from None


def _inconsistent(model: torch.nn.Module, exc: BaseException) -> ModelLoadError:
    return ModelLoadError(
        f"Torch-Pruning cannot prune {type(model).__name__} consistently: after a pruning "
        f"step its forward fails with {_first_line(exc)} (sizes fixed in the model code?)"
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
