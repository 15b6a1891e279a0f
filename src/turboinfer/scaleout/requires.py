"""Ray Serve is the ``ray`` extra: a missing install is one line naming it."""

from __future__ import annotations

from turboinfer.errors import MissingDependencyError

RAY_HINT = "pip install 'turboinfer[ray]'"


def require_ray() -> None:
    """Raise ``MissingDependencyError`` (exit 2) when Ray Serve cannot be imported."""
    try:
        import ray  # noqa: F401  # why: optional (the ray extra); probed, not used here
        from ray import serve  # noqa: F401  # why: the serve part of the same extra
    except ImportError:
        raise MissingDependencyError(f"--ray needs Ray Serve: {RAY_HINT}") from None
