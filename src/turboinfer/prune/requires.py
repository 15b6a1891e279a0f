"""Torch-Pruning, the one optional package pruning needs, imported where it is used.

It comes with the ``prune`` extra rather than with the package, so ``import
turboinfer.prune`` works without it and pruning says what to install.
"""

from __future__ import annotations

from types import ModuleType

from turboinfer.errors import MissingDependencyError

INSTALL_HINT = "pip install 'turboinfer[prune]'"


def torch_pruning() -> ModuleType:
    """The ``torch_pruning`` module, or a ``MissingDependencyError`` naming the extra."""
    try:
        import torch_pruning  # why: optional (the prune extra)
    except ImportError:
        raise MissingDependencyError(
            f"pruning needs Torch-Pruning: {INSTALL_HINT}") from None
    return torch_pruning
