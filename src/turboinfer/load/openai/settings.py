"""What one LLM load test sends and how: parsed once from the command line, passed whole."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from turboinfer.errors import ConfigError


class EndpointKind(str, Enum):
    COMPLETIONS = "completions"
    CHAT = "chat"

    @property
    def path(self) -> str:
        return "/v1/completions" if self is EndpointKind.COMPLETIONS else "/v1/chat/completions"


class Dataset(str, Enum):
    RANDOM = "random"  # random token ids of exactly --input-len tokens
    STDLIB = "stdlib"  # docstrings of Python's standard library, cut to --input-len tokens


_SLO_ITEM = re.compile(r"^\s*(ttft|tpot|e2el)\s*=\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")


@dataclass(frozen=True)
class Slo:
    """Per-request bounds for goodput, in milliseconds; None leaves a metric unbounded."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @classmethod
    def parse(cls, text: str) -> Slo:
        """``ttft=500ms,tpot=50ms,e2el=2s`` (a bare number is milliseconds)."""
        values: dict[str, float] = {}
        for item in filter(str.strip, text.split(",")):
            match = _SLO_ITEM.match(item)
            if not match:
                raise ConfigError(f"bad --slo item {item.strip()!r}: use ttft=500ms, "
                                  "tpot=50ms or e2el=2s")
            scale = 1000.0 if match.group(3) == "s" else 1.0
            values[f"{match.group(1)}_ms"] = float(match.group(2)) * scale
        return cls(**values)

    @property
    def active(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))

    def to_dict(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft_ms", self.ttft_ms), ("tpot_ms", self.tpot_ms),
                                  ("e2el_ms", self.e2el_ms)) if v is not None}


@dataclass(frozen=True)
class LoadSettings:
    url: str
    endpoint: EndpointKind = EndpointKind.COMPLETIONS
    model: str | None = None  # None: the first model the server lists
    dataset: Dataset = Dataset.RANDOM
    tokenizer: Path | None = None  # a folder with tokenizer.json; None: the demo model's
    num_prompts: int = 64
    input_len: int = 64
    output_len: int = 64
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    warmup: int = 1
    seed: int = 0
    ignore_eos: bool = True
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    slo: Slo = Slo()
    timeout_s: float = 300.0  # one request
    duration_s: float = 600.0  # the whole run: nothing is sent, nor awaited, past it

    def __post_init__(self) -> None:
        if self.request_rate <= 0:
            raise ConfigError("--request-rate must be > 0 (or inf)")
        if not self.burstiness > 0:
            raise ConfigError("--burstiness must be > 0")
        if min(self.num_prompts, self.input_len, self.output_len) < 1:
            raise ConfigError("--num-prompts, --input-len and --output-len must be >= 1")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ConfigError("--max-concurrency must be >= 1")
