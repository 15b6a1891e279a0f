"""Model sources: an ONNX file on disk, ``builtin:NAME`` from the zoo, or a user's torch
model (``package.module:factory``, a TorchScript ``.pt`` / ``torch.export`` ``.pt2`` file,
a Hugging Face model folder).

``resolve_model`` turns the reference a user typed into a ``ModelArtifact`` an engine can
load. Builtins and torch sources are exported to ONNX once and kept in the cache, keyed
by what they are built from (the entry's version; the source's files and weights) and
the torch that exported them, so a change to either builds a fresh file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from turboinfer.engines.base import ModelArtifact
from turboinfer.errors import ModelLoadError, UnknownModelError
from turboinfer.models.cache import cache_dir
from turboinfer.models.refs import BUILTIN, is_source
from turboinfer.models.zoo import ZooEntry, get_entry, names

_EXPORT_BATCH = 2  # torch.export would fix a dynamic axis whose example size is 1
_OPSET = 18


@dataclass(frozen=True)
class ResolvedModel:
    """A model reference, resolved: what engines load, and the zoo entry if it is one."""

    name: str
    artifact: ModelArtifact
    entry: ZooEntry | None = None


def resolve_model(ref: str) -> ResolvedModel:
    """``builtin:NAME``, a path to an ``.onnx`` file or a torch source → a loadable model.

    Raises ``UnknownModelError`` when the reference names nothing and ``ModelLoadError``
    when a file exists but is not a usable model.
    """
    if ref.startswith(BUILTIN):
        entry = get_entry(ref[len(BUILTIN) :])
        artifact = ModelArtifact(entry.name, builtin_onnx(entry), torch_module=entry.build)
        return ResolvedModel(entry.name, artifact, entry)
    if is_source(ref):
        from turboinfer.models.convert import cached_source  # imports torch: seconds

        name, onnx_path, module = cached_source(ref)
        return ResolvedModel(name, ModelArtifact(name, onnx_path, torch_module=module))
    path = Path(ref).expanduser()
    if path.exists() or path.suffix == ".onnx":
        from turboinfer.models.onnx_file import check_onnx  # onnx: 0.3 s, not for listing

        check_onnx(path)
        return ResolvedModel(path.stem, ModelArtifact(path.stem, path))
    hint = f" (did you mean {BUILTIN}{ref}?)" if ref in names() else ""
    raise UnknownModelError(
        f"unknown model {ref!r}{hint}: use a path to an .onnx file, package.module:factory, "
        f"a .pt/.pt2 file, a Hugging Face model folder, or {BUILTIN}NAME with NAME one of "
        f"{', '.join(names())}"
    )


def list_models() -> list[ZooEntry]:
    """Every built-in model, by name."""
    return [get_entry(name) for name in names()]


def builtin_onnx(entry: ZooEntry) -> Path:
    """The entry's ONNX export from the cache, exporting it first if it is missing or broken."""
    from turboinfer.models.onnx_file import check_onnx  # onnx: 0.3 s, not for listing

    path = cache_dir() / "onnx" / f"{entry.name}-{_export_key(entry)}.onnx"
    if path.exists():
        try:
            check_onnx(path)
            return path
        except ModelLoadError:
            pass  # rebuilt below; the export replaces the broken file atomically
    return _export(entry, path)


def _export(entry: ZooEntry, path: Path) -> Path:
    import torch  # seconds to import: only when an export is needed

    from turboinfer.models.export import export_onnx  # imports torch

    module = entry.build()
    if not isinstance(module, torch.nn.Module):
        raise ModelLoadError(f"builtin {entry.name} did not build a torch.nn.Module")
    return export_onnx(
        module,
        entry.example_inputs(_EXPORT_BATCH),
        path,
        input_names=entry.input_names,
        output_names=entry.output_names,
        dynamic_axes=entry.dynamic_axes,
        opset=_OPSET,
    )


def _export_key(entry: ZooEntry) -> str:
    import torch  # seconds to import; the key needs its version

    parts = (entry.name, entry.version, torch.__version__, str(_OPSET))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]
