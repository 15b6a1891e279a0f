"""The report of one run: a JSON document, and the text table printed by default."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from turboinfer.load.openai.metrics import Distribution, Summary, summarize
from turboinfer.load.openai.runner import RunOutcome
from turboinfer.load.openai.settings import LoadSettings
from turboinfer.output import format_table


@dataclass(frozen=True)
class LlmLoadReport:
    settings: dict[str, Any]
    model: str | None
    summary: Summary
    requests: list[dict[str, Any]]
    started_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def to_dict(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "model": self.model,
                "settings": self.settings, "summary": self.summary.to_dict(),
                "requests": self.requests}


def build_report(settings: LoadSettings, outcome: RunOutcome) -> LlmLoadReport:
    summary = summarize(outcome.results, outcome.duration_s, settings.slo)
    requests = [{"start_s": r.start_s, "prompt_tokens": r.prompt_len,
                 "output_tokens": r.output_tokens, "ttft_ms": r.ttft_s * 1e3,
                 "tpot_ms": r.tpot_s * 1e3, "e2el_ms": r.e2el_s * 1e3,
                 "itl_ms": [gap * 1e3 for gap in r.itl_s], "error": r.error}
                for r in outcome.results]
    return LlmLoadReport(_settings_dict(settings), outcome.model, summary, requests)


def _settings_dict(settings: LoadSettings) -> dict[str, Any]:
    rate = settings.request_rate
    return {"url": settings.url, "endpoint": settings.endpoint.value,
            "dataset": settings.dataset.value, "num_prompts": settings.num_prompts,
            "input_len": settings.input_len, "output_len": settings.output_len,
            "request_rate": "inf" if math.isinf(rate) else rate,
            "burstiness": settings.burstiness, "max_concurrency": settings.max_concurrency,
            "ignore_eos": settings.ignore_eos, "temperature": settings.temperature,
            "extra_body": settings.extra_body, "slo": settings.slo.to_dict(),
            "seed": settings.seed}


def format_text(report: LlmLoadReport) -> str:
    s, cfg = report.summary, report.settings
    lines = [f"{cfg['url']} {cfg['endpoint']} model={report.model or '?'} "
             f"dataset={cfg['dataset']} in={cfg['input_len']} out={cfg['output_len']} "
             f"rate={cfg['request_rate']} concurrency={cfg['max_concurrency'] or 'unbounded'}",
             f"requests: {s.completed} completed, {s.failed} failed in {s.duration_s:.2f} s",
             f"throughput: {s.request_throughput:.2f} req/s, "
             f"{s.output_throughput:.1f} output tok/s, "
             f"{s.total_token_throughput:.1f} total tok/s "
             f"({s.total_input_tokens} in, {s.total_output_tokens} out)",
             f"output tokens counted by the server for {s.counted_by_server} of "
             f"{s.completed} requests, by the local tokenizer for the rest"]
    if cfg["slo"]:
        slo = ", ".join(f"{k[:-3]}<={v:g}ms" for k, v in cfg["slo"].items())
        lines.append(f"goodput: {s.goodput:.2f} req/s ({s.good_requests} of {s.completed} "
                     f"within {slo})")
    rows = [[name, *_cells(d)] for name, d in (("TTFT", s.ttft), ("TPOT", s.tpot),
                                               ("ITL", s.itl), ("E2EL", s.e2el))]
    lines += ["", format_table(("ms", "mean", "p50", "p90", "p99", "max", "n"), rows)]
    for error, count in s.errors.items():
        lines.append(f"failed: {count} x {error}")
    return "\n".join(lines)


def _cells(d: Distribution) -> list[float | int]:
    return [d.mean, d.p50, d.p90, d.p99, d.max, d.count]
