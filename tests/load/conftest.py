"""Fixtures for the load tests; the servers themselves live in ``load_helpers``, which
tests import by that unique name (a module named ``conftest`` is ambiguous in a suite
with several conftest files)."""

from load_helpers import _shared_server, dead_url, oip_server, real_server

__all__ = ["_shared_server", "dead_url", "oip_server", "real_server"]
