"""A port for a server that is started by another process and so cannot be handed a
bound socket (Ray Serve's proxy, torch.distributed's rendezvous)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Below the kernel's ephemeral range: ports no bind(0) and no outgoing connection is
# given, so the one chosen here stays free until the server binds it, however many
# processes start in between (a local Ray instance starts dozens, each binding a port).
LOWEST = 20000
TRIES = 64


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now on ``host``, outside the ephemeral range where the kernel has one
    below it; else (or after ``TRIES`` taken ones) any free port the kernel gives."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    low = _ephemeral_low()
    candidates = random.sample(range(LOWEST, low), min(TRIES, low - LOWEST)) if low > LOWEST else []
    for port in [*candidates, 0]:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            found: int = sock.getsockname()[1]
            return found
    raise OSError(f"no free port on {host}")


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
