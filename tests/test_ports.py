"""A port for a server another process starts: free, and out of the kernel's way."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from turboinfer import ports


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    port = ports.free_port("127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))      # still free: nothing took it meanwhile
    low = ports._ephemeral_low()
    if low <= ports.LOWEST:
        pytest.skip(f"this kernel's ephemeral range starts at {low}: no room below it")
    assert ports.LOWEST <= port < low


def test_a_taken_port_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        taken.listen()
        # Every candidate is the taken port: the kernel's choice comes last.
        monkeypatch.setattr(ports.random, "sample", lambda population, n: [busy] * n)
        port = ports.free_port("127.0.0.1")
    assert port != busy and port > 0


def test_without_the_kernel_setting_any_free_port(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", tmp_path / "missing")
    port = ports.free_port("127.0.0.1")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
