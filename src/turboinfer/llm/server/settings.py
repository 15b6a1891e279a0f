"""The LLM server's settings: one frozen dataclass, validated once, passed whole."""

from __future__ import annotations

from dataclasses import dataclass

from turboinfer.errors import ConfigError


@dataclass(frozen=True)
class ServerSettings:
    """How the OpenAI-compatible server listens and what it admits.

    Admission: at most the engine's ``max_num_seqs`` sequences run together; up to
    ``max_waiting`` more wait for a slot; beyond that a request is refused at once with
    429 and ``Retry-After`` (retrying later can succeed, unlike a 4xx for bad input).
    ``request_timeout_s`` bounds a request from arrival to its last token; a request
    that runs out of time is aborted (its KV blocks freed) and answered 504.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "demo"
    api_key: str | None = None
    max_waiting: int = 256
    request_timeout_s: float = 600.0
    max_logprobs: int = 20
    retry_after_s: float = 1.0

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.max_waiting < 0:
            raise ConfigError("max_waiting must be >= 0")
        if self.request_timeout_s <= 0:
            raise ConfigError("request_timeout_s must be > 0")
        if not self.model_name:
            raise ConfigError("the served model name must not be empty")
