"""Per-request generation parameters, kept apart from the engine's settings."""

from __future__ import annotations

from dataclasses import dataclass

from turboinfer.errors import InvalidInputError
from turboinfer.llm.engine.structured import StructuredOutput


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens and when it stops.

    ``temperature=0`` is greedy decoding. ``top_k=0`` and ``top_p=1`` disable those
    filters. ``seed`` gives the request its own random stream, so its output does not
    depend on what else is in the batch. ``logprobs=N`` records each sampled token's
    log-probability under the model (before temperature and filters) and the N most
    likely tokens; ``None`` skips that work. ``structured`` constrains the output to a
    JSON object, a JSON schema, a regex or a grammar (``llm.structured``).
    """

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise InvalidInputError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise InvalidInputError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidInputError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidInputError(f"top_k must be >= 0, got {self.top_k}")
        if self.logprobs is not None and self.logprobs < 0:
            raise InvalidInputError(f"logprobs must be >= 0, got {self.logprobs}")
        if isinstance(self.stop, str):
            # A bare string would otherwise be read as a tuple of one-letter stops.
            object.__setattr__(self, "stop", (self.stop,))
        if any(not s for s in self.stop):
            raise InvalidInputError("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
