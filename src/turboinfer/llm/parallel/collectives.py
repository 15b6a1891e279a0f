"""The process group and the two collectives the parallel model needs.

Ranks meet on 127.0.0.1 at a free port. gloo carries CPU tensors; NCCL carries CUDA
tensors (one GPU per rank), chosen by the device the model is on.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

# Workers wait for the next step inside a broadcast for as long as the server idles, so
# the collective timeout is long; a dead rank-0 process is noticed by the worker's
# watchdog (group.py) instead.
IDLE_TIMEOUT = datetime.timedelta(days=7)


def _loopback_interface() -> str | None:
    return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_group(rank: int, world: int, port: int, device: torch.device) -> None:
    """Join the group of ``world`` ranks meeting at 127.0.0.1:``port``, over NCCL from
    ``device`` when it is a GPU (made this process's current one: NCCL's collectives
    run on it), else over gloo."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    loopback = _loopback_interface()
    if loopback is not None:
        # gloo otherwise uses the address the hostname resolves to, which may not be
        # reachable from a sandbox; every rank is on this machine.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    dist.init_process_group(backend_for(device), init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world, timeout=IDLE_TIMEOUT)


def broadcast_step(payload: Any) -> Any:
    """Rank 0 sends ``payload`` (a step's inputs, or None to stop); every rank returns it."""
    box = [payload]
    begin = time.perf_counter()
    dist.broadcast_object_list(box, src=0)
    BROADCASTS.seconds += time.perf_counter() - begin
    BROADCASTS.calls += 1
    return box[0]


@dataclass
class ReduceStats:
    """This process's all-reduces: how many, their payload and the time spent in them
    (waiting for the slowest rank included)."""

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


# The step broadcasts of this process (bytes not counted: pickled objects).
BROADCASTS = ReduceStats()


class AllReduce(nn.Module):
    """Sums the wrapped module's output over the ranks: the one all-reduce that ends a
    row-parallel projection or a block whose experts are split over the ranks."""

    stats = ReduceStats()  # one per process: every wrapper of the model adds to it

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> torch.Tensor:
        out: torch.Tensor = self.inner(*args)
        begin = time.perf_counter()
        dist.all_reduce(out)
        stats = AllReduce.stats
        stats.seconds += time.perf_counter() - begin
        stats.calls += 1
        stats.bytes += out.numel() * out.element_size()
        return out
