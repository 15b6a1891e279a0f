"""``turboinfer llm load URL``: load-test an OpenAI-compatible LLM server.

vLLM ``benchmark_serving`` semantics (TTFT, TPOT, ITL, E2EL, goodput) against
``/v1/completions`` or ``/v1/chat/completions``, streaming; see
``turboinfer.load.openai`` for what is sent and how each metric is measured.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from turboinfer.commands._args import duration, positive_float, positive_int
from turboinfer.errors import ConfigError
from turboinfer.load.openai.settings import LoadSettings

# Defaults come from the settings object, so the help and the library agree.
_DEFAULTS = LoadSettings(url="")


def add_load_parser(sub: Any) -> None:
    """The ``load`` action under ``llm``."""
    p = sub.add_parser("load", help="load-test an OpenAI-compatible server (TTFT, TPOT, "
                       "ITL, goodput)")
    p.add_argument("url", metavar="URL", help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                   help="/v1/completions or /v1/chat/completions")
    p.add_argument("--model", help="model name to send (default: the first in /v1/models)")
    p.add_argument("--dataset", choices=["random", "stdlib"], default="random",
                   help="random token prompts, or Python stdlib docstrings (real text)")
    p.add_argument("--tokenizer", type=Path, metavar="DIR",
                   help="folder with tokenizer.json (default: the demo model's)")
    p.add_argument("--num-prompts", type=positive_int, default=_DEFAULTS.num_prompts,
                   help="requests in the run")
    p.add_argument("--input-len", type=positive_int, default=_DEFAULTS.input_len,
                   help="prompt tokens")
    p.add_argument("--output-len", type=positive_int, default=_DEFAULTS.output_len,
                   help="max_tokens")
    p.add_argument("--request-rate", type=positive_float, default=_DEFAULTS.request_rate,
                   help="requests/s (inf: all at once), Poisson (burstiness 1) or gamma arrivals")
    p.add_argument("--burstiness", type=positive_float, default=_DEFAULTS.burstiness,
                   help="gamma shape: <1 burstier, >1 more even")
    p.add_argument("--max-concurrency", type=positive_int, default=None,
                   help="requests in flight at most (default: unbounded)")
    p.add_argument("--warmup", type=int, default=_DEFAULTS.warmup, help="unmeasured requests first")
    p.add_argument("--seed", type=int, default=_DEFAULTS.seed, help="prompts and arrivals")
    p.add_argument("--slo", default=None,
                   help="goodput bounds, e.g. ttft=500ms,tpot=50ms,e2el=2s (none: no goodput)")
    p.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="do not send ignore_eos/min_tokens")
    p.add_argument("--temperature", type=float, default=_DEFAULTS.temperature,
                   help="sampling temperature sent (0: greedy)")
    p.add_argument("--extra-body", default="{}", help="JSON object merged into each request")
    p.add_argument("--api-key", default=None,
                   help="Bearer token (when not given: $OPENAI_API_KEY, if set)")
    p.add_argument("--timeout", type=duration, default=_DEFAULTS.timeout_s, help="per request (s)")
    p.add_argument("--duration", type=duration, default=_DEFAULTS.duration_s,
                   help="limit on the whole run (s)")
    p.add_argument("--json", action="store_true", help="the JSON report on stdout")
    p.add_argument("--html", type=Path, metavar="FILE.html", help="an HTML report")
    p.set_defaults(_llm_run=run_load_command)


def _extra_body(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ConfigError(f"--extra-body is not JSON: {text!r}") from None
    if not isinstance(value, dict):
        raise ConfigError("--extra-body must be a JSON object")
    return value


def run_load_command(args: argparse.Namespace) -> int:
    # numpy, tokenizers and plotly load when a test runs, not for every --help.
    from turboinfer.load.openai.html import write_html
    from turboinfer.load.openai.report import build_report, format_text
    from turboinfer.load.openai.runner import run_load
    from turboinfer.load.openai.settings import Dataset, EndpointKind, Slo
    from turboinfer.output import print_json

    settings = LoadSettings(
        url=args.url, endpoint=EndpointKind(args.endpoint), model=args.model,
        dataset=Dataset(args.dataset), tokenizer=args.tokenizer,
        num_prompts=args.num_prompts, input_len=args.input_len, output_len=args.output_len,
        request_rate=args.request_rate, burstiness=args.burstiness,
        max_concurrency=args.max_concurrency, warmup=max(args.warmup, 0), seed=args.seed,
        ignore_eos=args.ignore_eos, temperature=args.temperature,
        extra_body=_extra_body(args.extra_body),
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
        slo=Slo.parse(args.slo or ""), timeout_s=args.timeout, duration_s=args.duration)
    report = build_report(settings, run_load(settings))
    if args.html:
        write_html(report, args.html)
    if args.json:
        print_json(report.to_dict())
    else:
        print(format_text(report))
    if report.summary.completed == 0:
        print("error: no request completed", file=sys.stderr)
        return 1
    return 0
