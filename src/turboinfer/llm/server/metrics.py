"""Prometheus metrics of the LLM server, with vLLM's semantics under ``turboinfer_llm_``.

Per-request latencies are observed once, when a request finishes, from the timestamps
the engine already keeps on the sequence (nothing is timed per token on the hot path):
TTFT and end-to-end latency from the request's arrival at the server, queue time until
the scheduler first admits it, prefill time from then to the first token, decode time
from the first token to the last, and one inter-token latency per engine step that gave
the request tokens (a speculative step that emits several tokens counts once, as in
vLLM). Gauges (running, waiting, KV usage, hit rates) are read from the engine loop's
per-step snapshot when /metrics is scraped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from turboinfer.llm.engine.sequence import Sequence
from turboinfer.llm.server.loop import EngineStats

PREFIX = "turboinfer_llm"
LABELS = ("model_name",)
# vLLM's buckets: TTFT and ITL live from milliseconds to seconds, requests up to minutes.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
               0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
                   20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class LLMMetrics:
    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self._model = model_name
        self.registry = CollectorRegistry()
        ProcessCollector(namespace="turboinfer", registry=self.registry)
        self.registry.register(_EngineCollector(model_name, stats))
        h = self._histogram
        self.ttft = h("time_to_first_token_seconds", "Time to first token", TTFT_BUCKETS)
        self.itl = h("inter_token_latency_seconds", "Time between engine steps that gave a "
                     "request tokens", ITL_BUCKETS)
        self.e2e = h("e2e_request_latency_seconds", "End-to-end request latency",
                     REQUEST_BUCKETS)
        self.queue = h("request_queue_time_seconds", "Time waiting before first scheduled",
                       REQUEST_BUCKETS)
        self.prefill = h("request_prefill_time_seconds", "First scheduled to first token",
                         REQUEST_BUCKETS)
        self.decode = h("request_decode_time_seconds", "First token to last token",
                        REQUEST_BUCKETS)
        r = self.registry
        prompt = Counter(f"{PREFIX}_prompt_tokens", "Prefill tokens processed", LABELS,
                         registry=r)
        generation = Counter(f"{PREFIX}_generation_tokens", "Generated tokens", LABELS,
                             registry=r)
        self.success = Counter(f"{PREFIX}_request_success", "Finished requests",
                               (*LABELS, "finished_reason"), registry=r)
        self.prompt_tokens = prompt.labels(model_name)
        self.generation_tokens = generation.labels(model_name)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
        family = Histogram(f"{PREFIX}_{name}", doc, LABELS, buckets=buckets,
                           registry=self.registry)
        return family.labels(self._model)  # one served model: bind the label once

    def finished(self, seq: Sequence, arrival: float) -> None:
        """Observe a finished request; ``arrival`` is when the server received it."""
        now = time.perf_counter()
        self.e2e.observe(now - arrival)
        self.prompt_tokens.inc(seq.num_prompt_tokens)
        self.success.labels(self._model, _reason(seq)).inc()
        if seq.first_scheduled_time is not None:
            self.queue.observe(max(seq.first_scheduled_time - arrival, 0.0))
        times = seq.token_times
        if seq.first_token_time is None or not times:
            return
        self.ttft.observe(seq.first_token_time - arrival)
        if seq.first_scheduled_time is not None:
            self.prefill.observe(seq.first_token_time - seq.first_scheduled_time)
        self.decode.observe(times[-1] - seq.first_token_time)
        prev = times[0]
        for t in times[1:]:
            if t != prev:  # tokens of one speculative step share nothing but a step
                self.itl.observe(t - prev)
                prev = t


def _reason(seq: Sequence) -> str:
    return seq.finish_reason.value if seq.finish_reason is not None else "abort"


class _EngineCollector(Collector):
    """Gauges read from the engine loop's latest snapshot at scrape time."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self._model = model_name
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        gauges = {
            "num_requests_running": ("Sequences in the running batch", s.running),
            "num_requests_waiting": ("Sequences waiting to be scheduled", s.waiting),
            "num_requests_swapped": ("Preempted sequences waiting to be recomputed",
                                     s.preempted_waiting),
            "kv_cache_usage_perc": ("Fraction of KV-cache blocks in use (0-1)",
                                    1 - s.free_blocks / s.total_blocks if s.total_blocks
                                    else 0.0),
            "kv_cache_free_blocks": ("Free KV-cache blocks", s.free_blocks),
            "kv_cache_total_blocks": ("KV-cache blocks", s.total_blocks),
            "prefix_cache_hit_rate": ("Prompt blocks served by the prefix cache (0-1)",
                                      s.prefix_hits / s.prefix_queries if s.prefix_queries
                                      else 0.0),
            "spec_decode_draft_acceptance_rate": (
                "Accepted / proposed speculative tokens (0-1)",
                s.spec_accepted / s.spec_drafted if s.spec_drafted else 0.0),
        }
        for name, (doc, value) in gauges.items():
            g = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=LABELS)
            g.add_metric([self._model], float(value))
            yield g
        c = CounterMetricFamily(f"{PREFIX}_num_preemptions", "Preemptions", labels=LABELS)
        c.add_metric([self._model], float(s.preemptions))
        yield c
