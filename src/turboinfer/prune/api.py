"""``prune``: one call from a trained ``nn.Module`` to a smaller, distilled one.

Order of work: copy the teacher, prune step by step (L1, then Taylor on fresh gradients),
optionally impose 2:4 sparsity, then distil from the teacher. The metric is taken before
pruning, right after it and after distillation, so the report shows what each stage did.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from turboinfer.errors import ConfigError
from turboinfer.prune import sparsity24, transformer
from turboinfer.prune.data import Batch, check_fits, first_batches, reiterable
from turboinfer.prune.distill import distill, taylor_loss
from turboinfer.prune.layers import LayerWidth, protected_layers, widths
from turboinfer.prune.requires import torch_pruning
from turboinfer.prune.schedule import PrunerSpec, build_pruner, check_runs, run_steps
from turboinfer.prune.settings import PruneSettings

EvalFn = Callable[[nn.Module], float]
# Training batches whose statistics replace BatchNorm's running ones after pruning.
NORM_BATCHES = 20


@dataclass(frozen=True)
class ModelSize:
    parameters: int
    macs: int  # multiply-accumulates of one forward on the example inputs


@dataclass(frozen=True)
class Metrics:
    """The caller's metric at each stage; ``None`` where no evaluation function was given."""

    before: float | None = None
    pruned: float | None = None
    semi_structured: float | None = None
    distilled: float | None = None


@dataclass
class PruneResult:
    model: nn.Module  # pruned and distilled, eval mode
    teacher: nn.Module  # the unpruned original, untouched
    size_before: ModelSize
    size_after: ModelSize
    metrics: Metrics
    widths_before: list[LayerWidth]
    widths_after: list[LayerWidth]
    protected: list[str]
    heads_before: list[int] = field(default_factory=list)
    heads_after: list[int] = field(default_factory=list)
    distill_losses: list[float] = field(default_factory=list)
    # With 2:4: the share of zeros in the masked layers, and the structured-only model
    # (same widths, dense weights) whose latency the 2:4 model is compared with.
    zero_fraction: float | None = None
    dense_model: nn.Module | None = None


def prune(
    module: nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    train_data: Iterable[Batch],
    eval_fn: EvalFn | None = None,
    settings: PruneSettings | None = None,
) -> PruneResult:
    """Prune ``module`` in place to ``settings.target_sparsity`` and distil it.

    ``example_inputs`` are positional ``forward`` arguments (for tracing); ``train_data``
    yields ``(inputs, labels or None)`` and is iterated once per distillation epoch;
    ``eval_fn(model) -> float`` scores a model, higher being better.
    """
    settings = settings or PruneSettings()
    torch_pruning()  # fail before any work when the prune extra is missing
    data = reiterable(train_data)
    check_fits(module, data)
    teacher = copy.deepcopy(module).eval()
    size_before, widths_before = model_size(module, example_inputs), widths(module)
    heads_before = transformer.head_counts(module)
    before = _score(eval_fn, module)
    spec, protected = _spec(module, example_inputs, settings)
    _prune_steps(module, teacher, example_inputs, data, settings, spec)
    recalibrate_norms(module, first_batches(data, NORM_BATCHES))
    pruned = _score(eval_fn, module)
    dense_model, masks = None, None
    if settings.semi_structured:
        dense_model, masks = _semi_structured(module, spec)
    masked = _score(eval_fn, module) if masks is not None else None
    after_update = (lambda: sparsity24.reapply(masks)) if masks is not None else None
    losses = distill(module, teacher, data, settings.distill, after_update=after_update,
                     taps=transformer.hidden_taps(module))
    return PruneResult(
        model=module.eval(),
        teacher=teacher,
        size_before=size_before,
        size_after=model_size(module, example_inputs),
        metrics=Metrics(before, pruned, masked, _score(eval_fn, module)),
        widths_before=widths_before,
        widths_after=widths(module),
        protected=protected,
        heads_before=heads_before,
        heads_after=transformer.head_counts(module),
        distill_losses=losses,
        zero_fraction=sparsity24.zero_fraction(masks) if masks is not None else None,
        dense_model=dense_model,
    )


def _semi_structured(
    module: nn.Module, spec: PrunerSpec
) -> tuple[nn.Module, sparsity24.Masks]:
    """2:4 masks on the pruned model, and a dense copy to time it against."""
    dense = copy.deepcopy(module).eval()
    return dense, sparsity24.apply_2to4(module, skip=spec.ignored)


def _spec(
    module: nn.Module, example_inputs: tuple[torch.Tensor, ...], settings: PruneSettings
) -> tuple[PrunerSpec, list[str]]:
    """The pruner's protected layers (and heads for BERT), with their names for the report."""
    if transformer.is_bert(module):
        spec = transformer.bert_spec(module)
    else:
        spec = PrunerSpec(ignored=protected_layers(module, example_inputs, settings.protect))
    names = {m: n for n, m in module.named_modules()}
    return spec, [names[m] for m in spec.ignored if m in names]


def _prune_steps(
    module: nn.Module,
    teacher: nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    data: Iterable[Batch],
    settings: PruneSettings,
    spec: PrunerSpec,
) -> None:
    pruner, steps = build_pruner(module, example_inputs, settings, spec)
    if pruner.initial_total_channels == 0:
        raise ConfigError(
            f"nothing to prune in {type(module).__name__}: every conv/linear layer is "
            "protected or has no prunable channels"
        )
    loss_fn = taylor_loss(settings.distill.objective)
    batches = first_batches(data, settings.taylor_batches)
    run_steps(module, teacher, pruner, steps, spec=spec, taylor_batches=batches, loss_fn=loss_fn)
    check_runs(module, example_inputs)


def recalibrate_norms(module: nn.Module, batches: Sequence[Batch]) -> None:
    """BatchNorm running statistics measured again on the pruned network.

    A cut channel changes what the next layer outputs, so the BatchNorm after it
    normalizes with the unpruned model's mean and variance. Re-estimating them (no
    gradients, weights untouched) gave a user's digits CNN at 50% 56.7% accuracy right
    after pruning instead of 12%, and 0.3 sparsity 88.4% instead of 39.8%.
    """
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
             and m.track_running_stats]
    if not norms or not batches:
        return
    momenta = [m.momentum for m in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average over the batches below
    training = module.training
    module.eval()  # dropout off: only the norms measure
    for norm in norms:
        norm.train()
    with torch.no_grad():
        for inputs, _ in batches:
            module(*inputs)
    for norm, momentum in zip(norms, momenta, strict=True):
        norm.momentum = momentum
    module.train(training)


def model_size(module: nn.Module, example_inputs: tuple[torch.Tensor, ...]) -> ModelSize:
    """Parameters and MACs as Torch-Pruning counts them (conv/linear/norm layers)."""
    macs, params = torch_pruning().utils.count_ops_and_params(module, example_inputs)
    return ModelSize(parameters=int(params), macs=int(macs))


def _score(eval_fn: EvalFn | None, module: nn.Module) -> float | None:
    if eval_fn is None:
        return None
    with torch.no_grad():
        return float(eval_fn(module.eval()))
