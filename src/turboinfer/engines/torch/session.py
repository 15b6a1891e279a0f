"""The torch engine's session: the protocol's numpy feeds in input order, a runner (the
direct path, or the CUDA path with staging and graphs), numpy FP32 results out."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from turboinfer.engines.base import Feeds, SpecsSession, TensorSpec, check_feeds
from turboinfer.errors import ConfigError, InferenceError, InvalidInputError


class Runner(Protocol):
    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]: ...


class TorchSession(SpecsSession):
    def __init__(self, runner: Runner, inputs: list[TensorSpec], outputs: list[TensorSpec],
                 device: torch.device, form: dict[str, Any]) -> None:
        super().__init__(inputs, outputs)
        self.runner = runner
        self.device = device
        self.form = form  # what it runs as: precision, channels_last, compile, graphs
        self._names = [spec.name for spec in inputs]
        self._dtypes = [spec.dtype for spec in inputs]
        self._output_names = [spec.name for spec in outputs]

    @property
    def cuda_stream(self) -> torch.cuda.Stream | None:
        """The instance's own CUDA stream (None on the CPU): timers put their CUDA events
        on it (``bench.latency.time_session``)."""
        return getattr(self.runner, "stream", None)

    def run(self, feeds: Feeds) -> dict[str, np.ndarray]:
        try:
            arrays = [np.asarray(feeds[name]) for name in self._names]
        except KeyError:
            check_feeds(self._inputs, feeds)
            raise
        if len(feeds) != len(arrays) or any(
                a.dtype != d for a, d in zip(arrays, self._dtypes, strict=True)):
            # The staging copies would convert a wrong dtype silently: refuse it here.
            check_feeds(self._inputs, feeds)
        try:
            values = self.runner.run(arrays)
        except torch.cuda.OutOfMemoryError as exc:
            # Valid inputs, too large a batch for what the GPU has left: the server's
            # configuration (max_batch_size, instances), not the request.
            raise InferenceError(f"torch ran out of GPU memory: {_first_line(exc)}") from None
        except (RuntimeError, TypeError, ValueError, IndexError, ConfigError) as exc:
            check_feeds(self._inputs, feeds)
            raise InvalidInputError(f"torch could not run the inputs: {_first_line(exc)}"
                                    ) from None
        return dict(zip(self._output_names, values, strict=False))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
