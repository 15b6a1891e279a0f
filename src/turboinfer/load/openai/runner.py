"""One load test end to end: prompts, arrivals, concurrency cap, time limit, results.

Requests go out on the arrival schedule; ``max_concurrency`` holds a request back until
another finishes (its send time, and so its TTFT, starts when it actually goes out, as in
vLLM). The run is bounded by the prompt count and by ``duration_s``: past it nothing new
is sent and requests still in flight are cut off and counted as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import orjson
from tokenizers import Tokenizer

from turboinfer.errors import ConfigError
from turboinfer.load.endpoint import Endpoint
from turboinfer.load.openai.arrivals import arrival_times
from turboinfer.load.openai.metrics import RequestResult
from turboinfer.load.openai.prompts import PromptRequest, build_prompts, load_tokenizer
from turboinfer.load.openai.protocol import request_body, to_result
from turboinfer.load.openai.settings import LoadSettings
from turboinfer.load.openai.stream import build_request, exchange, parse_exchange

CUT_OFF = "cut off at the run's time limit"
# How long the model lookup may take before the run goes on without a model name.
MODELS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RunOutcome:
    model: str | None
    results: tuple[RequestResult, ...]
    duration_s: float
    prompts: tuple[PromptRequest, ...]


def run_load(settings: LoadSettings) -> RunOutcome:
    endpoint = Endpoint.parse(settings.url)
    if endpoint.scheme != "http":
        raise ConfigError(f"not an http:// URL: {settings.url!r}")
    tokenizer = load_tokenizer(settings.tokenizer)
    prompts = build_prompts(settings, tokenizer)
    return asyncio.run(_run(settings, endpoint, tokenizer, prompts))


def _headers(settings: LoadSettings) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {settings.api_key}")] if settings.api_key else []


async def first_model(endpoint: Endpoint, settings: LoadSettings) -> str | None:
    """The first model ``GET /v1/models`` lists, or None when the server cannot say."""
    request = build_request(endpoint, "GET", "/v1/models", headers=_headers(settings))
    reply = await exchange(endpoint, request, MODELS_TIMEOUT_S)
    with contextlib.suppress(ValueError, orjson.JSONDecodeError, LookupError, TypeError):
        response = parse_exchange(reply.reads)
        if response.status == 200:
            return str(orjson.loads(response.body)["data"][0]["id"])
    return None


async def _run(settings: LoadSettings, endpoint: Endpoint, tokenizer: Tokenizer,
               prompts: list[PromptRequest]) -> RunOutcome:
    model = settings.model or await first_model(endpoint, settings)
    path, headers = settings.endpoint.path, _headers(settings)
    requests = [build_request(endpoint, "POST", path, request_body(settings, model, p),
                              headers) for p in prompts]
    semaphore = asyncio.Semaphore(settings.max_concurrency or len(prompts))

    async def one(index: int, origin_s: float) -> RequestResult:
        async with semaphore:
            reply = await exchange(endpoint, requests[index], settings.timeout_s)
        return to_result(reply, settings.endpoint, prompts[index], tokenizer, origin_s)

    for index in range(min(settings.warmup, len(prompts))):
        await one(index, time.perf_counter())
    schedule = arrival_times(len(prompts), settings.request_rate, settings.burstiness,
                             seed=settings.seed)
    origin = time.perf_counter()
    deadline = origin + settings.duration_s
    tasks: list[asyncio.Task[RequestResult]] = []
    for index, at in enumerate(schedule.tolist()):
        delay = origin + at - time.perf_counter()
        if origin + at >= deadline:
            break
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(index, origin)))
    results = await _gather_until(tasks, deadline, origin)
    return RunOutcome(model, tuple(results), time.perf_counter() - origin, tuple(prompts))


async def _gather_until(tasks: list[asyncio.Task[RequestResult]], deadline: float,
                        origin: float) -> list[RequestResult]:
    if tasks:
        await asyncio.wait(tasks, timeout=max(deadline - time.perf_counter(), 0.0))
    results = []
    for task in tasks:
        if task.done():
            results.append(task.result())
        else:
            task.cancel()
            results.append(RequestResult(start_s=time.perf_counter() - origin, prompt_len=0,
                                         error=CUT_OFF))
    await asyncio.gather(*tasks, return_exceptions=True)
    return results
