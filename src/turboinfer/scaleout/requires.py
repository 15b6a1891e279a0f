"""Ray Serve is the ``ray`` extra: a missing install is one line naming it."""

from __future__ import annotations

import os

from turboinfer.errors import MissingDependencyError

RAY_HINT = "pip install 'turboinfer[ray]'"
# Read by Ray when it is imported: off, a local instance puts every one of its services
# (GCS, raylet, workers) on 127.0.0.1 instead of the machine's network address, as Ray
# does on laptops. Ray resolves an explicit 127.0.0.1 node address to the network one.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def require_ray(*, loopback: bool = False) -> None:
    """Raise ``MissingDependencyError`` (exit 2) when Ray Serve cannot be imported;
    ``loopback``: a local instance started later listens on 127.0.0.1 only."""
    if loopback:
        os.environ.setdefault(LOOPBACK_ONLY, "0")
    try:
        import ray  # noqa: F401  # why: optional (the ray extra); probed, not used here
        from ray import serve  # noqa: F401  # why: the serve part of the same extra
    except ImportError:
        raise MissingDependencyError(f"--ray needs Ray Serve: {RAY_HINT}") from None
