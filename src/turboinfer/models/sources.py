"""A user's torch model, from the reference they typed, ready to export and to run.

Three kinds of reference name a torch model (a Hugging Face folder is ``models/hf.py``):

- ``package.module:factory``: a callable returning an ``nn.Module``. Example inputs come
  from ``--example-input`` specs or from an ``example_inputs()`` function in the module.
- a TorchScript file (``.pt``, ``.pth``, ``.ts``), read with ``torch.jit.load``.
- a ``torch.export`` file (``.pt2``), read with ``torch.export.load``; it carries its
  example inputs.

Example input spec: ``NAME=D1xD2x...[:DTYPE]``, e.g. ``image=1x3x32x32:float32`` or
``tokens=2x16:int64``. The first axis is the batch axis, exported as dynamic; the dtype
is a numpy name (default ``float32``). Float inputs are filled with standard normal
values, integer inputs with 0 and 1 (valid token ids and mask values).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from turboinfer.errors import ConfigError, ModelLoadError, UnknownModelError
from turboinfer.models.refs import PROGRAM_SUFFIX, SCRIPT_SUFFIXES

SPEC_SYNTAX = "NAME=D1xD2x...[:DTYPE], e.g. image=1x3x32x32:float32"


@dataclass(frozen=True)
class InputSpec:
    """One example input: its name, full shape (batch first) and numpy dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"

    def example(self, seed: int = 0) -> torch.Tensor:
        rng = np.random.default_rng(seed)
        kind = np.dtype(self.dtype).kind
        if kind == "f":
            array = rng.standard_normal(self.shape).astype(self.dtype)
        else:
            array = rng.integers(0, 2, self.shape).astype(self.dtype)
        return torch.from_numpy(array)


def parse_input_spec(text: str) -> InputSpec:
    """``NAME=D1xD2[:DTYPE]`` → ``InputSpec``; ``ConfigError`` naming the syntax otherwise."""
    name, sep, rest = text.partition("=")
    dims, _, dtype = rest.partition(":")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
        dtype = np.dtype(dtype or "float32").name
    except (TypeError, ValueError):
        shape = ()
    if not sep or not name or not shape or min(shape) < 1:
        raise ConfigError(f"bad example input {text!r}: expected {SPEC_SYNTAX}")
    return InputSpec(name.strip(), shape, dtype)


@dataclass(frozen=True)
class TorchSource:
    """A torch model with everything an export and a numerical check need.

    ``module`` is what is exported; ``runnable`` is called with the inputs in
    ``input_names`` order (for a ``torch.export`` program it is the program's module).
    ``fingerprint`` is what identifies the model's code and weights for the cache.
    """

    name: str
    module: torch.nn.Module | torch.jit.ScriptModule | torch.export.ExportedProgram
    runnable: torch.nn.Module
    examples: dict[str, torch.Tensor]
    output_names: tuple[str, ...]
    dynamic_axes: Mapping[str, Mapping[int, str]] = field(default_factory=dict)
    fingerprint: tuple[str, ...] = ()

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(self.examples)

    def run(self, feeds: Mapping[str, np.ndarray | torch.Tensor]) -> list[np.ndarray]:
        """The source's outputs on ``feeds``, flattened in ``output_names`` order."""
        args = [torch.as_tensor(feeds[name]) for name in self.input_names]
        with torch.no_grad():
            return [t.detach().numpy() for t in flat_outputs(self.runnable(*args))]


def load_torch_source(ref: str, specs: Sequence[InputSpec] = ()) -> TorchSource:
    """A factory reference or a TorchScript / ``torch.export`` file → ``TorchSource``."""
    path = Path(ref).expanduser()
    if path.suffix in (*SCRIPT_SUFFIXES, PROGRAM_SUFFIX):
        if not path.is_file():
            raise UnknownModelError(f"model file not found: {path}")
        if path.suffix == PROGRAM_SUFFIX:
            return _from_program(path, specs)
        return _from_script(path, specs)
    return _from_factory(ref, specs)


def _from_factory(ref: str, specs: Sequence[InputSpec]) -> TorchSource:
    return factory_source(ref, lambda model: specs)


def factory_source(
    ref: str, specs_for: Callable[[torch.nn.Module], Sequence[InputSpec]]
) -> TorchSource:
    """``package.module:factory`` → ``TorchSource``, the example inputs chosen once the
    model exists (``specs_for(model)``; empty: the module's ``example_inputs()`` hook)."""
    module_name, _, attribute = ref.partition(":")
    module = _import(module_name, ref)
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise UnknownModelError(
            f"module {module_name!r} has no callable {attribute!r}: name a function that "
            "returns the torch.nn.Module, as package.module:function"
        )
    try:
        model = factory()
    except Exception as exc:
        raise ModelLoadError(f"factory {ref} failed: {one_line(exc)}") from None
    if not isinstance(model, torch.nn.Module):
        raise ModelLoadError(
            f"factory {ref} returned {type(model).__name__}, not a torch.nn.Module: "
            "return the model instance"
        )
    model.eval()
    specs = specs_for(model)
    hook = getattr(module, "example_inputs", None)
    examples = _examples(ref, model, specs, hook() if callable(hook) and not specs else None)
    source_file = getattr(module, "__file__", None) or ""
    code = _file_digest(Path(source_file)) if source_file else module_name
    return _finish(attribute, model, model, examples, (ref, code, _state_digest(model)))


def _import(module_name: str, ref: str) -> object:
    # Like `python -m`, a module in the working directory is found without installing it.
    added = "" not in sys.path and str(Path.cwd()) not in sys.path
    if added:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownModelError(
            f"cannot import {module_name!r} for {ref}: {one_line(exc)}; run from the folder "
            "that holds the package or add it to PYTHONPATH"
        ) from None
    except Exception as exc:
        raise ModelLoadError(
            f"importing {module_name!r} for {ref} failed: {one_line(exc)}"
        ) from None
    finally:
        if added:
            sys.path.remove(str(Path.cwd()))


def _from_script(path: Path, specs: Sequence[InputSpec]) -> TorchSource:
    try:
        model = torch.jit.load(str(path), map_location="cpu").eval()
    except Exception as exc:
        raise ModelLoadError(
            f"cannot read TorchScript file {path}: {one_line(exc)} (a .pt of weights only "
            "is not a model: save it with torch.jit.script(model).save(path))"
        ) from None
    examples = _examples(str(path), model, specs, None)
    return _finish(path.stem, model, model, examples, (_file_digest(path),))


def _from_program(path: Path, specs: Sequence[InputSpec]) -> TorchSource:
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise ModelLoadError(f"cannot read torch.export file {path}: {one_line(exc)}") from None
    names = [spec.name for spec in specs] or list(program.graph_signature.user_inputs)
    carried = program.example_inputs[0] if program.example_inputs else None
    examples = _examples(str(path), None, specs, carried, names=names)
    runnable = _Frozen(program.module())
    return _finish(path.stem, program, runnable, examples, (_file_digest(path),))


class _Frozen(torch.nn.Module):
    """Holds a ``torch.export`` program's module, which refuses ``train()``/``eval()``."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def train(self, mode: bool = True) -> _Frozen:
        return self  # the program is already in inference form

    def forward(self, *args: torch.Tensor) -> object:
        return self.inner(*args)


def _examples(
    ref: str,
    model: torch.nn.Module | None,
    specs: Sequence[InputSpec],
    given: object,
    names: Sequence[str] = (),
) -> dict[str, torch.Tensor]:
    if specs:
        return {spec.name: spec.example(seed) for seed, spec in enumerate(specs)}
    if isinstance(given, Mapping):
        return {str(k): torch.as_tensor(v) for k, v in given.items()}
    if isinstance(given, torch.Tensor | np.ndarray):
        given = (given,)
    if isinstance(given, tuple | list) and given:
        labels = list(names) or parameter_names(model, len(given))
        return {label: torch.as_tensor(v) for label, v in zip(labels, given, strict=False)}
    raise ConfigError(
        f"{ref} needs example inputs: pass --example-input {SPEC_SYNTAX} (once per input), "
        "or define example_inputs() beside the factory (commands other than export need it)"
    )


def parameter_names(model: torch.nn.Module | None, count: int) -> list[str]:
    """Names of ``forward``'s first ``count`` parameters, ``input_N`` where none are known."""
    found: list[str] = []
    if isinstance(model, torch.jit.ScriptModule):
        schema = getattr(model.forward, "schema", None)
        found = [a.name for a in schema.arguments[1:]] if schema is not None else []
    elif model is not None:
        params = inspect.signature(model.forward).parameters.values()
        found = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return [found[i] if i < len(found) else f"input_{i}" for i in range(count)]


def _finish(
    name: str,
    module: torch.nn.Module | torch.jit.ScriptModule | torch.export.ExportedProgram,
    runnable: torch.nn.Module,
    examples: dict[str, torch.Tensor],
    fingerprint: tuple[str, ...],
) -> TorchSource:
    """Name the outputs by running the model once, and mark every batch axis dynamic."""
    try:
        with torch.no_grad():
            result = runnable(*examples.values())
    except Exception as exc:
        raise ModelLoadError(
            f"{name} cannot run on the example inputs "
            f"({', '.join(f'{k}={list(v.shape)}' for k, v in examples.items())}): {one_line(exc)}"
        ) from None
    outputs = output_names(result)
    axes = {label: {0: "batch"} for label in (*examples, *outputs)}
    return TorchSource(name, module, runnable, examples, outputs, axes, fingerprint)


def flat_outputs(result: object) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, Mapping):
        return [t for v in result.values() for t in flat_outputs(v)]
    if isinstance(result, tuple | list):
        return [t for v in result for t in flat_outputs(v)]
    raise ModelLoadError(f"the model returned {type(result).__name__}; return tensors")


def output_names(result: object) -> tuple[str, ...]:
    if isinstance(result, Mapping) and all(isinstance(v, torch.Tensor) for v in result.values()):
        return tuple(str(k) for k in result)
    count = len(flat_outputs(result))
    return ("output",) if count == 1 else tuple(f"output_{i}" for i in range(count))


def _file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _state_digest(model: torch.nn.Module) -> str:
    """A digest of the weights: a factory that loads new weights gets a new export."""
    digest = hashlib.sha256()
    for key, tensor in model.state_dict().items():
        digest.update(key.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def one_line(exc: BaseException) -> str:
    """The first line of an exception, short enough for a one-line error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 240 else text[:237] + "..."
