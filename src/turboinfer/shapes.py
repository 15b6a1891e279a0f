"""Input-shape flags: one meaning in every command that takes them.

``NAME=D1xD2x...`` is the shape of one input **without its batch axis** when the model
has one (a dynamic first axis), and the whole shape when it has none. The batch size
comes from the command's own batch flag (``--batch-sizes``, ``--batch-size``). This is
what Triton's perf_analyzer means by ``-b 4 --shape IMAGE:3,224,224``, and it lets one
shape serve a sweep over batch sizes.

A flag that names no input of the model, has the wrong number of axes, a size below 1,
or contradicts a fixed axis is an ``InvalidInputError`` naming the input and the model's
inputs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from turboinfer.errors import InvalidInputError

SHAPE_SYNTAX = "NAME=D1xD2x..."
SHAPE_HELP = (
    "one input's shape without its batch axis, e.g. image=3x224x224 (the whole shape when "
    "the model has no batch axis); once per input; the batch size comes from {batch_flag}. "
    "See 'Input shapes' in the README"
)

# Axis sizes as a model states them; None is a dynamic axis ("?" in messages).
Dims = tuple[int | None, ...]


@dataclass(frozen=True)
class DeclaredInput:
    """One model input as the model states it; ``None`` marks a dynamic axis."""

    name: str
    dims: Dims

    @property
    def batched(self) -> bool:
        """A dynamic first axis is the batch axis."""
        return bool(self.dims) and self.dims[0] is None

    @property
    def inner(self) -> Dims:
        """The axes a shape flag gives: all but the batch axis."""
        return self.dims[1:] if self.batched else self.dims

    def describe(self) -> str:
        axes = ["batch"] if self.batched else []
        axes += ["?" if d is None else str(d) for d in self.inner]
        return f"{self.name!r} [{', '.join(axes)}]"


def parse_shape_flag(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME=D1xD2`` → (name, dims); ``ValueError`` on bad syntax. Sizes are checked
    against the model later, so the message can name its inputs."""
    name, sep, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        shape = ()
    if not sep or not name.strip() or not shape:
        raise ValueError(f"expected {SHAPE_SYNTAX}, got {text!r}")
    return name.strip(), shape


def resolve_shapes(flags: Iterable[tuple[str, tuple[int, ...]]],
                   inputs: Sequence[DeclaredInput], *, model: str,
                   flag: str = "--shape") -> dict[str, tuple[int, ...]]:
    """Check every shape flag against the model's inputs; name → shape without batch."""
    by_name = {spec.name: spec for spec in inputs}
    resolved: dict[str, tuple[int, ...]] = {}
    for name, dims in flags:
        problem = _problem(name, dims, by_name, resolved)
        if problem:
            given = f"{flag} {name}={'x'.join(map(str, dims))}"
            listed = ", ".join(spec.describe() for spec in inputs) or "none"
            raise InvalidInputError(f"{given}: {problem}; model {model!r} takes {listed} "
                                    f"(shapes exclude the batch axis)")
        resolved[name] = dims
    return resolved


def _problem(name: str, dims: tuple[int, ...], by_name: Mapping[str, DeclaredInput],
             resolved: Mapping[str, tuple[int, ...]]) -> str:
    """What is wrong with one flag, or "" when nothing is."""
    if name not in by_name:
        return f"no input is named {name!r}"
    if name in resolved:
        return f"input {name!r} is given twice"
    spec = by_name[name]
    inner = spec.inner
    if len(dims) != len(inner):
        axes = f"{len(inner)} ax{'i' if len(inner) == 1 else 'e'}s"
        besides = " besides the batch axis" if spec.batched else ""
        return f"input {name!r} has {axes}{besides}, {len(dims)} given"
    if min(dims) < 1:
        return f"sizes of input {name!r} must be >= 1"
    for want, got in zip(inner, dims, strict=True):
        if want is not None and want != got:
            return f"input {name!r} has a fixed size {want} where {got} is given"
    return ""


def concrete_shape(spec: DeclaredInput, batch_size: int,
                   shapes: Mapping[str, tuple[int, ...]], *,
                   dynamic_size: int | None = None, flag: str = "--shape") -> tuple[int, ...]:
    """The shape to feed ``spec`` at ``batch_size``: the batch axis takes the batch size,
    the rest comes from ``shapes`` (checked by :func:`resolve_shapes`), then fixed sizes,
    then ``dynamic_size``; with no ``dynamic_size`` a dynamic axis needs a shape flag."""
    given = shapes.get(spec.name)
    sizes = []
    for size in given if given is not None else spec.inner:
        if size is None:
            if dynamic_size is None:
                raise InvalidInputError(f"input {spec.describe()} has dynamic axes; give its shape "
                                  f"with {flag} {spec.name}=D1xD2... (without the batch axis)")
            size = dynamic_size
        sizes.append(size)
    return (batch_size, *sizes) if spec.batched else tuple(sizes)


def fixed_batch(inputs: Sequence[DeclaredInput]) -> int | None:
    """The only batch size a model without a batch axis takes (its first input's first
    axis, 1 for scalars); ``None`` when some input has a batch axis."""
    if not inputs or any(spec.batched for spec in inputs):
        return None
    first = inputs[0].dims
    return first[0] if first and first[0] is not None else 1
