"""Disconnects free the KV blocks at once; metrics; the OIP generate extension."""

from __future__ import annotations

import json
import urllib.request

from llm_server_helpers import API_KEY, Server

from turboinfer.llm import LLM, SamplingParams


def test_a_disconnect_mid_stream_frees_the_blocks(server: Server, reference: LLM) -> None:
    client = server.client()
    stream = client.completions.create(model="demo", prompt="The module", max_tokens=400,
                                       temperature=0, stream=True)
    events = iter(stream)
    for _ in range(3):
        next(events)
    during = server.get_json("/health")
    assert during["kv_free_blocks"] < during["kv_total_blocks"]
    stream.close()
    after = server.wait_idle()
    assert after["kv_free_blocks"] == after["kv_total_blocks"]
    assert after["requests_running"] == 0 and after["requests_in_server"] == 0
    # ... and the server keeps serving, with the right answer.
    out = client.completions.create(model="demo", prompt="Return the", max_tokens=8,
                                    temperature=0)
    expected = reference.generate("Return the", SamplingParams(max_tokens=8, temperature=0))
    assert out.choices[0].text == expected[0].text


def test_metrics_have_vllm_families(server: Server) -> None:
    server.client().completions.create(model="demo", prompt="The module", max_tokens=4)
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    for name in ("time_to_first_token_seconds_count", "inter_token_latency_seconds_count",
                 "e2e_request_latency_seconds_count", "request_queue_time_seconds_count",
                 "request_prefill_time_seconds_count", "request_decode_time_seconds_count",
                 "num_requests_running", "num_requests_waiting", "num_requests_swapped",
                 "kv_cache_usage_perc", "prefix_cache_hit_rate", "prompt_tokens_total",
                 "generation_tokens_total", "request_success_total",
                 "spec_decode_draft_acceptance_rate"):
        assert f"turboinfer_llm_{name}" in text, name
    assert 'turboinfer_llm_request_success_total{finished_reason="length",model_name="demo"}' \
        in text


def _post(server: Server, path: str, body: dict[str, object]) -> bytes:
    request = urllib.request.Request(f"{server.url}{path}", json.dumps(body).encode(),
                                     {"authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(request, timeout=60) as reply:
        return bytes(reply.read())


def test_oip_generate_and_generate_stream(server: Server, reference: LLM) -> None:
    expected = reference.generate("The module", SamplingParams(max_tokens=10, temperature=0))
    body = {"text_input": "The module", "parameters": {"max_tokens": 10, "temperature": 0}}
    whole = json.loads(_post(server, "/v2/models/demo/generate", body))
    assert whole["model_name"] == "demo" and whole["text_output"] == expected[0].text
    raw = _post(server, "/v2/models/demo/generate_stream",
                {"text_input": "The module", "max_tokens": 10, "temperature": 0})
    events = [json.loads(line[len(b"data: "):]) for line in raw.split(b"\n\n") if line]
    assert "".join(e["text_output"] for e in events) == expected[0].text
    assert events[-1]["finish_reason"] == "length"
