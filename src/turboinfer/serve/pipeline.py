"""A served version's pre- and post-processing, run around the batcher.

``prepare`` replaces a request's raw inputs (encoded images, strings) by the tensors the
model takes, before the request joins a batch, so batches form from decoded tensors;
``finish`` adds the post-processed outputs (and applies the classification extension)
to one request's share of a batch. A request may send the model's tensors instead of a
raw input: both doors stay open.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from turboinfer.engines import TensorSpec
from turboinfer.errors import ConfigError, InvalidInputError
from turboinfer.serve import postprocess
from turboinfer.serve.config import ModelConfig
from turboinfer.serve.images import ImageDecoder
from turboinfer.serve.metrics import usable_cores
from turboinfer.serve.prepost_config import ImagePreprocess
from turboinfer.serve.protocol import InferRequest
from turboinfer.serve.text import TextEncoder

BYTES = np.dtype(object)


class Pipeline:
    def __init__(self, model: str, config: ModelConfig, inputs: list[TensorSpec],
                 outputs: list[TensorSpec]) -> None:
        self.model = model
        self._specs = {spec.name: spec for spec in inputs}
        out_specs = {spec.name: spec for spec in outputs}
        self._pool: ThreadPoolExecutor | None = None
        self.images: dict[str, ImageDecoder] = {}
        self.texts: dict[str, TextEncoder] = {}
        for step in config.preprocess:
            self._check_raw_name(step.input)
            if isinstance(step, ImagePreprocess):
                self.images[step.input] = self._image(step)
            else:
                self.texts[step.input] = TextEncoder(step, self._specs)
        self.fills = {**{n: (d.settings.tensor,) for n, d in self.images.items()},
                      **{n: e.fills for n, e in self.texts.items()}}
        # Token axes differ from request to request: the batcher pads them.
        self.ragged = frozenset(name for e in self.texts.values() for name in e.fills)
        self.labels = {name: postprocess.read_labels(file)
                       for name, file in config.labels.items()}
        self.steps = config.postprocess
        self.extra_outputs = [self._post_spec(step, out_specs) for step in self.steps]

    @property
    def preprocesses(self) -> bool:
        return bool(self.fills)

    def _check_raw_name(self, name: str) -> None:
        if name in self._specs:
            raise ConfigError(f"model {self.model!r}: preprocess input {name!r} is also a "
                              "model input; give the raw input its own name")

    def _image(self, step: ImagePreprocess) -> ImageDecoder:
        spec = self._specs.get(step.tensor)
        if spec is None or len(spec.shape) != 4 or spec.dtype.kind != "f":
            raise ConfigError(f"model {self.model!r}: preprocess image fills {step.tensor!r}, "
                              "which must be an NCHW float input of the model")
        if self._pool is None:
            threads = step.threads or usable_cores()
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix=f"decode-{self.model}")
        return ImageDecoder(step, spec.dtype, self._pool)

    def _post_spec(self, step: postprocess.Postprocess, outputs: dict[str, TensorSpec]
                   ) -> TensorSpec:
        if step.output not in outputs:
            raise ConfigError(f"model {self.model!r}: postprocess {step.name!r} reads output "
                              f"{step.output!r}; the model has {', '.join(outputs)}")
        if step.name in outputs:
            raise ConfigError(f"model {self.model!r}: postprocess name {step.name!r} is "
                              "already a model output")
        batch = outputs[step.output].shape[:1]
        if step.kind == "topk":
            return TensorSpec(step.name, BYTES, (*batch, step.k))
        if step.kind == "argmax":
            return TensorSpec(step.name, np.dtype(np.int64), batch)
        return TensorSpec(step.name, np.dtype(np.float32), (*batch, "hidden"))

    def raw_metadata(self) -> list[dict[str, object]]:
        """The raw inputs as metadata entries; ``parameters`` say what each one fills."""
        entries: list[dict[str, object]] = []
        for kinds, table in (("image", self.images), ("text", self.texts)):
            for name in table:
                entries.append({"name": name, "datatype": "BYTES", "shape": [-1],
                                "parameters": {"preprocess": kinds,
                                               "fills": ",".join(self.fills[name])}})
        return entries

    async def prepare(self, request: InferRequest) -> float:
        """Decode the request's raw inputs in place; the seconds it took (0: none)."""
        inputs = request.inputs
        raw = [name for name in inputs if name in self.fills]
        if not raw:
            return 0.0
        start = time.perf_counter()
        for name in raw:
            value = inputs.pop(name)
            if value.dtype != BYTES:
                raise InvalidInputError(f"input {name!r} must be BYTES (encoded images or "
                                        f"strings), got {value.dtype}")
            for filled in self.fills[name]:
                if filled in inputs:
                    raise InvalidInputError(f"input {name!r} fills {filled!r}: send one of "
                                            "them, not both")
            inputs.update(await self._decode(name, value))
        return time.perf_counter() - start

    async def _decode(self, name: str, value: np.ndarray) -> dict[str, np.ndarray]:
        decoder = self.images.get(name)
        if decoder is not None:
            return {decoder.settings.tensor: await decoder.decode(name, value)}
        encoder = self.texts[name]
        if encoder.wants_thread(value):
            return await asyncio.to_thread(encoder.encode, name, value)
        return encoder.encode(name, value)

    def finish(self, request: InferRequest, outputs: dict[str, np.ndarray]
               ) -> dict[str, np.ndarray]:
        """Post-processed outputs beside the model's; the classification extension."""
        wanted = None if request.outputs is None else {o.name for o in request.outputs}
        result = dict(outputs)
        for step in self.steps:
            if wanted is None or step.name in wanted:
                labels = self.labels.get(step.output, ())
                result[step.name] = postprocess.run_step(step, outputs, request.inputs, labels)
        for output in request.outputs or ():
            if output.classification:
                result[output.name] = postprocess.classification(
                    output.name, result[output.name], output.classification,
                    self._labels_of(output.name))
        return result

    def _labels_of(self, output: str) -> Sequence[str]:
        return self.labels.get(output, ())

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
