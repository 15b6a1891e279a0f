"""CUDA only: the instance's own stream, pinned host staging, CUDA graphs per bucket.

Every copy and launch of a run goes on the session's stream, so several instances of a
model (or several models) share one GPU and overlap; the one host sync of a run is the
wait for its output copy. Inputs are copied into pinned host buffers first, so the
host-to-device copy is a real asynchronous DMA (pageable memory would make it a staged,
synchronous one). With ``cuda_graphs`` each batch-size bucket is captured once at load
and a batch is padded up to its bucket and replayed: one launch instead of one per kernel.
Nothing here runs without a GPU; the device-agnostic parts (forms, buckets) are tested
on the CPU and this file's tests skip with "needs CUDA".
"""

from __future__ import annotations

import math

import numpy as np
import torch

from turboinfer.engines.base import TensorSpec
from turboinfer.engines.torch.buckets import bucket_for
from turboinfer.engines.torch.forms import TORCH_DTYPES, Forward
from turboinfer.errors import ConfigError

GRAPH_WARMUPS = 3  # runs before a capture: lazy inits (cuDNN plans, compile) stay out of it


class Staging:
    """Growable flat buffers, one per tensor slot, handed out as views of the shape
    asked for: a run allocates nothing once the buffers are as large as its batch."""

    def __init__(self, device: torch.device, pinned: bool) -> None:
        self._device = device
        self._pinned = pinned
        self._buffers: dict[int, torch.Tensor] = {}

    def view(self, slot: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        numel = math.prod(shape)
        buffer = self._buffers.get(slot)
        if buffer is None or buffer.dtype != dtype or buffer.numel() < numel:
            size = max(numel, 2 * buffer.numel() if buffer is not None else 0)
            buffer = torch.empty(size, dtype=dtype, device=self._device,
                                 pin_memory=self._pinned)
            self._buffers[slot] = buffer
        return buffer[:numel].view(shape)

    def fill(self, slot: int, array: np.ndarray) -> torch.Tensor:
        """A pinned view holding a copy of ``array``."""
        view = self.view(slot, TORCH_DTYPES[array.dtype], array.shape)
        np.copyto(view.numpy(), array, casting="no")
        return view


class CudaRunner:
    def __init__(self, forward: Forward, inputs: list[TensorSpec], device: torch.device,
                 buckets: tuple[int, ...]) -> None:
        self._forward = forward
        self._inputs = inputs
        self._device = device
        self.stream = torch.cuda.Stream(device)
        # Batches are padded to buckets only when the first axis is a batch axis.
        self._batched = all(s.shape and not isinstance(s.shape[0], int) for s in inputs)
        self.buckets = buckets if self._batched else ()
        self._host_in = Staging(torch.device("cpu"), pinned=True)
        self._device_in = Staging(device, pinned=False)
        self._host_out = Staging(torch.device("cpu"), pinned=True)
        # Graph inputs live in their own buffers: a capture holds their addresses, and
        # the eager path's buffers may be reallocated to fit a larger batch.
        self._graph_inputs: list[torch.Tensor] = []
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, list[torch.Tensor]]] = {}

    def warm_up(self) -> None:
        """One run per bucket (or one at batch 1): compiled kernels are built and cuDNN
        picks its algorithms at load, and a model that does not fit fails here."""
        for rows in self.buckets or (1,):
            self.run(_zeros(self._inputs, rows))

    def capture(self) -> None:
        """A CUDA graph per bucket, largest first so the smaller ones reuse its memory
        from the shared pool."""
        rest = []
        for spec in self._inputs:
            dynamic = [i for i, d in enumerate(spec.shape[1:], 1) if not isinstance(d, int)]
            if dynamic:
                raise ConfigError(f"cuda_graphs needs fixed axes besides the batch axis; "
                                  f"input {spec.name!r} has a dynamic axis {dynamic[0]}")
            rest.append(tuple(int(d) for d in spec.shape[1:]))  # type: ignore[arg-type]
        sizes = self.buckets or (_fixed_rows(self._inputs),)
        largest = max(sizes)
        self._graph_inputs = [
            torch.zeros((largest, *shape), dtype=TORCH_DTYPES[spec.dtype], device=self._device)
            for spec, shape in zip(self._inputs, rest, strict=True)]
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for rows in sorted(sizes, reverse=True):
                args = [t[:rows] for t in self._graph_inputs]
                with torch.cuda.stream(self.stream):
                    for _ in range(GRAPH_WARMUPS):
                        self._forward(args)
                self.stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                # thread_local: other instances may run on the GPU while this one captures.
                with torch.cuda.graph(graph, pool=pool, stream=self.stream,
                                      capture_error_mode="thread_local"):
                    outputs = self._forward(args)
                self.graphs[rows] = (graph, outputs)
        self.stream.synchronize()

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        rows = arrays[0].shape[0] if arrays and arrays[0].ndim else 1
        bucket = bucket_for(rows, self.buckets) if self.buckets else None
        graph = self.graphs.get(bucket if bucket is not None else rows)
        with torch.inference_mode(), torch.cuda.stream(self.stream):
            if graph is not None:
                for slot, array in enumerate(arrays):
                    staged = self._host_in.fill(slot, array)
                    self._graph_inputs[slot][:rows].copy_(staged, non_blocking=True)
                graph[0].replay()
                outputs = graph[1]
            else:
                args = []
                for slot, array in enumerate(arrays):
                    staged = self._host_in.fill(slot, array)
                    shape = (bucket or rows, *array.shape[1:]) if array.ndim else ()
                    target = self._device_in.view(slot, staged.dtype, shape)
                    (target[:rows] if array.ndim else target).copy_(staged, non_blocking=True)
                    args.append(target)
                outputs = self._forward(args)
            padded = bucket is not None and bucket != rows
            hosts = []
            for slot, output in enumerate(outputs):
                source = output[:rows] if padded and output.ndim else output
                host = self._host_out.view(slot, source.dtype, tuple(source.shape))
                host.copy_(source, non_blocking=True)
                hosts.append(host)
        self.stream.synchronize()  # the run's one host sync: its outputs are in host memory
        return [host.numpy().copy() for host in hosts]


def _zeros(inputs: list[TensorSpec], rows: int) -> list[np.ndarray]:
    return [np.zeros([rows if i == 0 and not isinstance(d, int) else
                      (d if isinstance(d, int) else 1) for i, d in enumerate(s.shape)],
                     dtype=s.dtype) for s in inputs]


def _fixed_rows(inputs: list[TensorSpec]) -> int:
    first = inputs[0].shape[0] if inputs and inputs[0].shape else 1
    return first if isinstance(first, int) else 1


def free_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of the GPU, as the driver sees them now."""
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)
