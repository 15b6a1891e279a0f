"""The plain path: numpy arrays in, the forward on the device, numpy arrays out. On the
CPU ``torch.from_numpy`` shares the request's memory, so nothing is staged or copied on
the way in.

torch's intra-op thread count is process-wide, so a session loaded with a count of its
own sets it again before a run when another session changed it since: sessions with
different counts in one process (tune's candidates, timed in turn) each run on theirs."""

from __future__ import annotations

import numpy as np
import torch

from turboinfer.engines.torch.forms import Forward


class DirectRunner:
    def __init__(self, forward: Forward, device: torch.device, threads: int = 0) -> None:
        self._forward = forward
        self._cpu = device.type == "cpu"
        self._device = device
        self._threads = threads  # 0: whatever the process has

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if self._threads and torch.get_num_threads() != self._threads:
            torch.set_num_threads(self._threads)
        args = [torch.from_numpy(a) for a in arrays]
        if not self._cpu:
            args = [a.to(self._device) for a in args]
        with torch.inference_mode():
            outputs = self._forward(args)
        return [np.ascontiguousarray(o.cpu().numpy()) for o in outputs]
