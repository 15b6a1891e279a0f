"""Knowledge distillation from the unpruned teacher, and the losses it and Taylor use.

Logits: the student matches the teacher's temperature-softened distribution (KL, scaled
by T² so its gradients keep their size as T grows) and, where labels exist, the labels.
Embeddings: the student matches the teacher's vector in direction (cosine) and position
(squared distance), which for unit vectors are the same signal with different curvature.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial

import torch
from torch.nn import functional as F

from turboinfer.prune.data import Batch, batch_count
from turboinfer.prune.importance import LossFn
from turboinfer.prune.settings import DistillSettings, Objective


def logits_loss(temperature: float, alpha: float) -> LossFn:
    def loss(
        student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor | None
    ) -> torch.Tensor:
        soft = F.kl_div(
            F.log_softmax(student / temperature, dim=-1),
            F.log_softmax(teacher / temperature, dim=-1),
            reduction="batchmean",
            log_target=True,
        ) * temperature**2
        if labels is None:
            return soft
        return alpha * soft + (1.0 - alpha) * F.cross_entropy(student, labels)

    return loss


def embedding_loss(
    student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor | None = None
) -> torch.Tensor:
    cosine = F.cosine_similarity(student, teacher, dim=-1)  # [B]
    squared = (student - teacher).pow(2).sum(dim=-1)  # [B]
    return (1.0 - cosine).mean() + squared.mean()


def ranking_loss(
    student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor | None
) -> torch.Tensor:
    """The task loss Taylor importance differentiates for classifiers.

    Without labels the teacher's classes stand in: a KL to the teacher would be zero, with
    zero gradients, before the first cut.
    """
    return F.cross_entropy(student, labels if labels is not None else teacher.argmax(dim=-1))


def distill_loss(settings: DistillSettings) -> LossFn:
    if settings.objective is Objective.EMBEDDING:
        return embedding_loss
    return logits_loss(settings.temperature, settings.alpha)


def taylor_loss(objective: Objective) -> LossFn:
    # Embeddings have no task loss to differentiate; the distance to the teacher is the
    # task. It is zero before any cut, so an L1 phase should come first for encoders.
    return embedding_loss if objective is Objective.EMBEDDING else ranking_loss


@contextlib.contextmanager
def tapped(model: torch.nn.Module, names: Sequence[str]) -> Iterator[list[torch.Tensor]]:
    """Collect the outputs of ``model``'s submodules ``names`` during each forward.

    The list is cleared by the caller between forwards; a tuple output contributes its
    first element (the hidden states of a transformer layer).
    """
    outputs: list[torch.Tensor] = []
    modules = dict(model.named_modules())

    def keep(_: torch.nn.Module, __: object, output: object) -> None:
        outputs.append(output[0] if isinstance(output, tuple) else output)  # type: ignore[arg-type]

    handles = [modules[name].register_forward_hook(keep) for name in names]
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def feature_loss(student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor]) -> torch.Tensor:
    """One minus the cosine between matching intermediate outputs, per position, averaged.

    Many values per sample (every token's hidden state, not one pooled vector) constrain
    the student far more than the output alone. Cosine rather than squared error: a few
    hidden dimensions of BERT run far larger than the rest and would own a squared error.
    """
    losses = [(1.0 - F.cosine_similarity(s, t, dim=-1)).mean()
              for s, t in zip(student, teacher, strict=True)]
    return torch.stack(losses).mean()


def distill(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    data: Iterable[Batch],
    settings: DistillSettings,
    *,
    after_update: Callable[[], None] | None = None,
    taps: Sequence[str] = (),
    freeze_norms: bool = False,
    lr_scale: Mapping[str, float] | None = None,
    deadline: float | None = None,
) -> list[float]:
    """Train ``student`` toward ``teacher`` for ``settings.epochs``; mean loss per epoch.

    ``after_update`` runs after every optimizer step (2:4 masks are re-applied there).
    ``taps`` name submodules whose outputs keep their shape under pruning (transformer
    layers writing the hidden stream); their outputs are matched too, weighted by
    ``settings.feature_weight``. ``freeze_norms`` keeps BatchNorm on its running
    statistics (quantization-aware training: the engine folds them into the convs).
    ``lr_scale`` multiplies the learning rate of the parameters whose names start with
    a key (quantization ranges learn faster than weights). Training stops at the
    first batch that ends after ``deadline`` (``time.monotonic()``), a time budget.
    """
    if settings.epochs == 0:
        return []
    loss_fn = distill_loss(settings)
    optimizer = torch.optim.AdamW(
        _groups(student, settings.lr, lr_scale or {}), lr=settings.lr,
        weight_decay=settings.weight_decay,
    )
    batches = batch_count(data)
    # Per batch when the batch count is known: one or two long epochs over a large text
    # set would otherwise run at a constant rate.
    steps = settings.epochs * batches if batches else settings.epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(_cosine, total=steps))
    step_lr = schedule.step if batches else None
    # An embedding target is deterministic; dropout in the student only blurs it (on
    # builtin:minilm held-out cosine after 400 batches: 0.869 with it, 0.883 without).
    dropout = settings.objective is not Objective.EMBEDDING
    teacher.eval()
    history = []
    with tapped(student, taps) as s_feats, tapped(teacher, taps) as t_feats:

        def batch_loss(
            inputs: tuple[torch.Tensor, ...], labels: torch.Tensor | None
        ) -> torch.Tensor:
            s_feats.clear()
            t_feats.clear()
            with torch.no_grad():
                target = teacher(*inputs)
            loss = loss_fn(student(*inputs), target, labels)
            if taps:
                loss = loss + settings.feature_weight * feature_loss(s_feats, t_feats)
            return loss

        for _ in range(settings.epochs):
            on_batch = [f for f in (step_lr, after_update) if f is not None]
            history.append(_epoch(student, data, batch_loss, optimizer, on_batch,
                                  dropout=dropout, freeze_norms=freeze_norms,
                                  deadline=deadline))
            if step_lr is None:
                schedule.step()
            if deadline is not None and time.monotonic() >= deadline:
                break
    student.eval()
    return history


def _groups(
    model: torch.nn.Module, lr: float, scale: Mapping[str, float]
) -> list[dict[str, object]]:
    """Parameter groups: one at ``lr``, one per ``scale`` prefix at ``lr`` times its factor."""
    groups: dict[float, list[torch.nn.Parameter]] = {}
    for name, parameter in model.named_parameters():
        factor = next((f for prefix, f in scale.items() if name.startswith(prefix)), 1.0)
        groups.setdefault(factor, []).append(parameter)
    return [{"params": params, "lr": lr * factor} for factor, params in groups.items()]


def _cosine(step: int, total: int) -> float:
    """Learning-rate factor: from 1 down a half cosine to 0 at ``total`` steps."""
    return 0.5 * (1.0 + math.cos(math.pi * min(step, total) / max(total, 1)))


def _epoch(
    student: torch.nn.Module,
    data: Iterable[Batch],
    batch_loss: Callable[[tuple[torch.Tensor, ...], torch.Tensor | None], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    on_batch: Sequence[Callable[[], None]],
    *,
    dropout: bool,
    freeze_norms: bool = False,
    deadline: float | None = None,
) -> float:
    """One pass over ``data``; the mean loss. ``on_batch`` runs after every update."""
    student.train()
    for module in student.modules():
        if not dropout and isinstance(module, torch.nn.Dropout):
            module.eval()  # BatchNorm and the rest stay in training mode
        if freeze_norms and isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.eval()
    total, count = 0.0, 0
    for inputs, labels in data:
        loss = batch_loss(inputs, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        for hook in on_batch:
            hook()
        total, count = total + loss.item(), count + 1
        if deadline is not None and time.monotonic() >= deadline:
            break
    return total / max(count, 1)
