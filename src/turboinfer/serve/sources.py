"""Where served models come from: a repository folder, or the built-in zoo.

A source answers two questions: what is on disk now (a ``Snapshot``: the validated config
and a fingerprint per version, compared between polls to notice changes), and which file
a version is (a ``ModelArtifact``). Both may block, so callers run them on a thread.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from turboinfer.engines import ModelArtifact
from turboinfer.errors import ConfigError, UnknownModelError
from turboinfer.models import resolve_model
from turboinfer.serve.config import CONFIG_FILE, DynamicBatching, ModelConfig, load_config
from turboinfer.serve.zoo_prepost import with_prepost

# A version's fingerprint: (mtime_ns, size) of its model file, None when the file is absent.
Fingerprint = tuple[int, int] | None


@dataclass(frozen=True)
class Snapshot:
    config: ModelConfig
    versions: dict[int, Fingerprint]
    config_stamp: Fingerprint = None


class ModelSource(Protocol):
    name: str

    def read(self) -> Snapshot: ...

    def artifact(self, version: int, config: ModelConfig) -> ModelArtifact: ...


def _stamp(path: Path) -> Fingerprint:
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size)


class DirectorySource:
    """``REPO/<name>/config.yaml`` and numbered version folders."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.name

    def read(self) -> Snapshot:
        config = load_config(self.path / CONFIG_FILE)  # ConfigError names file and key
        config = config.with_files_under(self.path)
        try:
            folders = [p for p in self.path.iterdir() if p.is_dir() and p.name.isdigit()]
        except OSError as exc:
            raise ConfigError(f"cannot read model folder {self.path}: {exc.strerror}") from None
        # A model as code (source:) has no file per version: the folder is the version.
        versions = {int(p.name): _stamp(p if config.source else p / config.model_file)
                    for p in folders}
        return Snapshot(config, versions, _stamp(self.path / CONFIG_FILE))

    def artifact(self, version: int, config: ModelConfig) -> ModelArtifact:
        path = self.path / str(version) / config.model_file
        if config.engine != "torch":
            return ModelArtifact(self.name, path)
        # The torch engine runs the module; resolve_model builds it (and the cached ONNX
        # export that names its tensors) from the source or the version's torch file.
        if config.source is None and not path.exists():
            raise UnknownModelError(f"model file not found: {path} (engine torch reads a "
                                    ".pt2, a TorchScript .pt or a Hugging Face folder, or "
                                    "a source: in config.yaml)")
        resolved = resolve_model(config.source or str(path)).artifact
        return replace(resolved, name=self.name)


# Built-in models batch opportunistically: no queue delay, so a lone client pays nothing,
# while concurrent clients' requests merge into whatever batch forms next.
ZOO_CONFIG = ModelConfig(max_batch_size=32,
                         dynamic_batching=DynamicBatching(max_queue_delay_ms=0.0))


class ZooSource:
    """A built-in model as version 1; built (exported to ONNX, cached) on first load.
    Image and text models take raw inputs too (``zoo_prepost``)."""

    def __init__(self, name: str, config: ModelConfig = ZOO_CONFIG) -> None:
        self.name = name
        self.config = config
        self._prepared: ModelConfig | None = None

    def read(self) -> Snapshot:
        if self._prepared is None:  # finding the tokenizer imports the model's module
            self._prepared = with_prepost(self.name, self.config)
        return Snapshot(self._prepared, {1: (0, 0)})

    def artifact(self, version: int, config: ModelConfig) -> ModelArtifact:
        return resolve_model(f"builtin:{self.name}").artifact


def scan_directory(root: Path) -> dict[str, ModelSource]:
    """Every model folder under ``root`` (hidden folders, e.g. staging, are skipped)."""
    if not root.is_dir():
        raise ConfigError(f"model repository {root} is not a folder")
    return {p.name: DirectorySource(p) for p in sorted(root.iterdir())
            if p.is_dir() and not p.name.startswith(".")}


def zoo_sources(names: list[str]) -> dict[str, ModelSource]:
    return {name: ZooSource(name) for name in names}
