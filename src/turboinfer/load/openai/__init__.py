"""Load testing OpenAI-compatible LLM servers with vLLM ``benchmark_serving`` semantics.

One module per part: ``settings`` (what to send), ``prompts`` (random-token and stdlib
text prompt sets), ``arrivals`` (Poisson/gamma schedule), ``stream`` (raw HTTP with
per-read timestamps), ``protocol`` (request bodies, SSE chunks to metrics), ``metrics``
(TTFT, TPOT, ITL, E2EL, goodput), ``runner`` (one run), ``report`` and ``html``.
"""
