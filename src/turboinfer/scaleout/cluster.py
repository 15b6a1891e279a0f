"""Joining or starting the Ray cluster and Ray Serve's HTTP proxy, and staying up until
SIGTERM/SIGINT: the part the OIP and the LLM deployments share."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import ray
from ray import serve

from turboinfer.errors import ConfigError
from turboinfer.ports import free_port

LOCAL = "local"
# Warnings and errors only: Ray Serve's access log writes a line per request in the
# proxy, the ingress and the replica, which the driver then reads back and prints.
LOGGING = {"log_level": "WARNING", "enable_access_log": False}


@dataclass(frozen=True)
class RaySettings:
    """``address``: ``local`` starts a Ray instance for this process (stopped with it);
    ``auto`` or ``ray://HOST:PORT`` joins a running cluster, where the applications
    stay until this process stops. ``num_cpus``: what a local instance may schedule."""

    address: str = LOCAL
    num_cpus: int | None = None


class Stopper:
    """SIGTERM/SIGINT handling over Ray's own: before ``serving()`` a signal interrupts
    the start (KeyboardInterrupt: the CLI exits 130 and Ray is shut down); after it, a
    signal ends ``wait()``."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._serving = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stop.set()
        if not self._serving:
            raise KeyboardInterrupt

    def serving(self) -> None:
        self._serving = True

    def wait(self) -> None:
        while not self._stop.wait(1.0):
            pass


@contextlib.contextmanager
def ray_serve(settings: RaySettings, host: str, port: int) -> Iterator[tuple[int, Stopper]]:
    """Ray and Serve started (or joined) with the HTTP proxy on ``host:port`` (0: a free
    one); yields the port and the signal handling; shuts what it started down on exit."""
    port = port or free_port(host)
    if settings.address == LOCAL:
        # On loopback when the server is (``require_ray(loopback=True)``): nothing of
        # the local instance then listens outside this machine.
        # Ray starts workers at niceness 15 so that its own daemons come first; here the
        # workers are the server (replicas, ingress, proxy) and must not yield the CPU
        # to every other process on the machine (measured: 30 requests/s instead of
        # thousands beside a busy neighbour).
        ray.init(address="local", include_dashboard=False, num_cpus=settings.num_cpus,
                 _system_config={"worker_niceness": 0})
    else:
        try:
            ray.init(address=settings.address)
        except ConnectionError as exc:
            raise ConfigError(f"cannot join the Ray cluster at {settings.address}: "
                              f"{exc}") from None
    try:
        stopper = Stopper()  # after ray.init, which installs handlers of its own
        serve.start(http_options={"host": host, "port": port}, logging_config=LOGGING)
        yield port, stopper
    finally:
        with contextlib.suppress(Exception):  # stopping must not hide the real error
            serve.shutdown()
        ray.shutdown()
