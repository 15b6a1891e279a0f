"""vLLM ``benchmark_serving`` metrics from per-request chunk timestamps.

- TTFT: first streamed chunk carrying a choice, minus the send time.
- ITL: the gap between consecutive such chunks (a chunk holding several tokens is one
  gap, as in vLLM; TPOT is the per-token view).
- E2EL: the last such chunk minus the send time.
- TPOT: ``(e2el - ttft) / (output_tokens - 1)`` for requests with more than one token.
- Goodput: completed requests per second whose TTFT, TPOT and E2EL are all within the SLO
  (a one-token request counts TPOT as 0).

Percentiles are numpy's linear interpolation, as vLLM reports them, so numbers compare
with published ``benchmark_serving`` results.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from turboinfer.load.openai.settings import Slo

PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class RequestResult:
    """One request's outcome; times in seconds, ``start_s`` from the start of the run."""

    start_s: float
    prompt_len: int
    output_tokens: int = 0
    ttft_s: float = 0.0
    e2el_s: float = 0.0
    itl_s: tuple[float, ...] = ()
    error: str | None = None
    counted_by_server: bool = False  # output tokens from the server's usage, not re-tokenized

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot_s(self) -> float:
        if self.output_tokens <= 1:
            return 0.0
        return (self.e2el_s - self.ttft_s) / (self.output_tokens - 1)


def from_chunks(*, start_s: float, sent_s: float, chunk_times: Sequence[float],
                prompt_len: int, output_tokens: int,
                counted_by_server: bool = False) -> RequestResult:
    """The metrics of a request sent at ``sent_s`` whose chunks arrived at ``chunk_times``
    (all on one clock); ``start_s`` places it on the run's time axis."""
    times = np.asarray(chunk_times, dtype=np.float64)
    return RequestResult(start_s=start_s, prompt_len=prompt_len,
                         output_tokens=output_tokens,
                         ttft_s=float(times[0] - sent_s), e2el_s=float(times[-1] - sent_s),
                         itl_s=tuple(np.diff(times).tolist()),
                         counted_by_server=counted_by_server)


@dataclass(frozen=True)
class Distribution:
    """Milliseconds."""

    count: int
    mean: float
    std: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Distribution:
        if not len(seconds):
            return cls(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        ms = np.asarray(seconds, dtype=np.float64) * 1000.0
        p50, p90, p99 = (float(v) for v in np.percentile(ms, PERCENTILES))
        return cls(len(ms), float(ms.mean()), float(ms.std()), p50, p90, p99,
                   float(ms.max()))


@dataclass(frozen=True)
class Summary:
    completed: int
    failed: int
    errors: dict[str, int]
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    counted_by_server: int  # completed requests whose output tokens the server counted
    good_requests: int
    goodput: float  # requests/s within the SLO; 0 without an SLO
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2el: Distribution

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_good(result: RequestResult, slo: Slo) -> bool:
    bounds = ((slo.ttft_ms, result.ttft_s), (slo.tpot_ms, result.tpot_s),
              (slo.e2el_ms, result.e2el_s))
    return result.ok and all(b is None or value * 1000.0 <= b for b, value in bounds)


def summarize(results: Sequence[RequestResult], duration_s: float, slo: Slo) -> Summary:
    done = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    duration = max(duration_s, 1e-9)
    total_in = sum(r.prompt_len for r in done)
    total_out = sum(r.output_tokens for r in done)
    good = sum(is_good(r, slo) for r in done) if slo.active else 0
    return Summary(
        completed=len(done), failed=len(failed),
        errors=dict(Counter(str(r.error) for r in failed).most_common()),
        duration_s=duration_s, total_input_tokens=total_in, total_output_tokens=total_out,
        request_throughput=len(done) / duration, output_throughput=total_out / duration,
        total_token_throughput=(total_in + total_out) / duration,
        counted_by_server=sum(r.counted_by_server for r in done),
        good_requests=good, goodput=good / duration,
        ttft=Distribution.of([r.ttft_s for r in done]),
        tpot=Distribution.of([r.tpot_s for r in done if r.output_tokens > 1]),
        itl=Distribution.of([gap for r in done for gap in r.itl_s]),
        e2el=Distribution.of([r.e2el_s for r in done]),
    )
