"""Pruning settings: the schedule of importance criteria, protection, distillation.

Validated once here, so the pipeline below never re-checks a ratio or a name.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from turboinfer.errors import ConfigError

CRITERIA = ("l1", "taylor")
DEFAULT_SCHEDULE_SPLIT = 0.6  # L1 takes the first 60% of the target: coarse cuts first

# Training settings a built-in model gets unless the user sets them. builtin:minilm's
# training set is ~51,000 short texts (recombined bundled sentences): two epochs at batch
# 32 and lr 3e-4 are what benchmarks/README.md records (~16 minutes each on one core);
# the general defaults (10 epochs of batch 64 at 1e-4) would take over two hours there.
# A Hugging Face encoder folder is distilled on the same text, so it gets the same.
TEXT_ENCODER_TRAINING: dict[str, float] = {"epochs": 2, "lr": 3e-4, "batch_size": 32}
BUILTIN_TRAINING: dict[str, dict[str, float]] = {
    "minilm": TEXT_ENCODER_TRAINING,
}


def training_defaults(ref: str) -> dict[str, float]:
    """The training settings ``ref`` gets where the user sets none (empty: the general ones)."""
    from turboinfer.models.refs import BUILTIN, is_hf_folder  # torch-free

    if ref.startswith(BUILTIN):
        return BUILTIN_TRAINING.get(ref.removeprefix(BUILTIN), {})
    return TEXT_ENCODER_TRAINING if is_hf_folder(ref) else {}


class Objective(str, enum.Enum):
    """What the student learns from the teacher."""

    LOGITS = "logits"  # soft targets with temperature, plus hard labels where they exist
    EMBEDDING = "embedding"  # cosine + MSE to the teacher's embedding


class Protect(str, enum.Enum):
    FIRST = "first"  # the first conv/linear that reads the model's input
    LAST = "last"  # the conv/linear that produces the model's output


@dataclass(frozen=True)
class Phase:
    """One part of the schedule: remove ``amount`` of the channels with ``criterion``.

    ``amount`` is a fraction of the original channels, so the phases of a schedule add
    up to the target sparsity.
    """

    criterion: str
    amount: float

    def __post_init__(self) -> None:
        if self.criterion not in CRITERIA:
            raise ConfigError(
                f"unknown pruning criterion {self.criterion!r}: use one of {', '.join(CRITERIA)}"
            )
        if not 0.0 < self.amount < 1.0:
            raise ConfigError(
                f"schedule amount {self.amount} for {self.criterion} is not in (0, 1)"
            )


@dataclass(frozen=True)
class DistillSettings:
    """Knowledge distillation from the unpruned teacher after pruning.

    ``alpha`` weighs the soft-target loss against the hard-label loss (logits only);
    ``temperature`` softens both distributions so the student also learns the teacher's
    ranking of the wrong classes.
    """

    epochs: int = 10
    objective: Objective = Objective.LOGITS
    temperature: float = 4.0
    alpha: float = 0.7
    # 1e-4 kept digits-cnn within 0.5 points of its unpruned accuracy at 50% with either
    # protection; 3e-4 and 1e-3 shook a student that pruning had barely hurt.
    lr: float = 1e-4
    weight_decay: float = 1e-4
    # Weight of matching intermediate outputs whose width pruning keeps (BERT layers), as
    # one minus cosine per token. 3 equals the embedding loss' weight on its own 1 - cos
    # (its squared distance of unit vectors is 2 (1 - cos)).
    feature_weight: float = 3.0

    def __post_init__(self) -> None:
        if self.epochs < 0:
            raise ConfigError(f"distillation epochs must be >= 0, got {self.epochs}")
        if self.temperature <= 0:
            raise ConfigError(f"distillation temperature must be > 0, got {self.temperature}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"distillation alpha must be in [0, 1], got {self.alpha}")
        if self.lr <= 0:
            raise ConfigError(f"distillation learning rate must be > 0, got {self.lr}")


@dataclass(frozen=True)
class PruneSettings:
    """Everything that decides which channels go.

    - ``target_sparsity``: fraction of each prunable layer's channels (and attention heads)
      removed in the end.
    - ``schedule``: phases in order; empty means L1 for the first 60% of the target and
      Taylor for the rest.
    - ``steps_per_phase``: a phase removes its share in this many steps, so every later
      step ranks channels of the already-pruned network.
    - ``taylor_batches``: training batches whose gradients feed one Taylor ranking.
    - ``round_to``: keep channel counts multiples of this (SIMD-friendly widths); 1 is off.
    - ``semi_structured``: also apply 2:4 sparsity to the remaining weights.
    """

    target_sparsity: float = 0.5
    schedule: tuple[Phase, ...] = ()
    steps_per_phase: int = 2
    taylor_batches: int = 4
    protect: frozenset[Protect] = frozenset({Protect.FIRST, Protect.LAST})
    round_to: int = 1
    batch_size: int = 64
    seed: int = 0
    semi_structured: bool = False
    distill: DistillSettings = field(default_factory=DistillSettings)

    def __post_init__(self) -> None:
        if not 0.0 < self.target_sparsity < 1.0:
            raise ConfigError(f"target sparsity {self.target_sparsity} is not in (0, 1)")
        total = sum(p.amount for p in self.schedule)
        if self.schedule and abs(total - self.target_sparsity) > 1e-6:
            raise ConfigError(
                f"schedule removes {total:g} of the channels but the target sparsity is "
                f"{self.target_sparsity:g}; make the amounts add up to the target"
            )
        if self.steps_per_phase < 1 or self.taylor_batches < 1 or self.batch_size < 1:
            raise ConfigError("steps per phase, Taylor batches and batch size must be >= 1")
        if self.round_to < 1:
            raise ConfigError(f"round_to must be >= 1, got {self.round_to}")

    @property
    def phases(self) -> tuple[Phase, ...]:
        if self.schedule:
            return self.schedule
        first = round(self.target_sparsity * DEFAULT_SCHEDULE_SPLIT, 6)
        return (Phase("l1", first), Phase("taylor", round(self.target_sparsity - first, 6)))


def parse_schedule(text: str) -> tuple[Phase, ...]:
    """``"l1:0.3,taylor:0.2"`` → phases; the amounts are fractions of the original channels."""
    phases = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, amount = part.partition(":")
        try:
            value = float(amount)
        except ValueError:
            value = float("nan")
        if not sep or value != value:  # NaN: the amount is missing or not a number
            raise ConfigError(f"schedule part {part!r} is not CRITERION:AMOUNT, e.g. l1:0.3")
        phases.append(Phase(name.strip().lower(), value))
    if not phases:
        raise ConfigError(f"empty pruning schedule {text!r}")
    return tuple(phases)
