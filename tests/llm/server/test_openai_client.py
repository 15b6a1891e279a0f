"""The official ``openai`` client, unchanged, against a real ``turboinfer llm serve``."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from llm_server_helpers import Server

from turboinfer.llm import LLM, SamplingParams

PROMPTS = ["The module", "def read(", "Return the", "import os\n", "class Foo", "If the file",
           "This function", "The default value"]
MAX_TOKENS = 24


def _greedy(reference: LLM, prompt: str, **kw: object) -> str:
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, **kw)  # type: ignore[arg-type]
    return reference.generate(prompt, params)[0].text


def _stream_text(server: Server, prompt: str) -> str:
    stream = server.client().completions.create(model="demo", prompt=prompt,
                                                max_tokens=MAX_TOKENS, temperature=0,
                                                stream=True)
    return "".join(chunk.choices[0].text for chunk in stream)


def test_models_list(server: Server) -> None:
    models = server.client().models.list()
    assert [m.id for m in models.data] == ["demo"]
    assert models.data[0].object == "model"


def test_completion_equals_the_engine(server: Server, reference: LLM) -> None:
    out = server.client().completions.create(model="demo", prompt=PROMPTS[0],
                                             max_tokens=MAX_TOKENS, temperature=0)
    assert out.object == "text_completion" and out.model == "demo" and out.id
    choice = out.choices[0]
    assert choice.index == 0 and choice.finish_reason == "length"
    assert choice.text == _greedy(reference, PROMPTS[0])
    assert out.usage is not None
    assert out.usage.completion_tokens == MAX_TOKENS
    assert out.usage.total_tokens == out.usage.prompt_tokens + MAX_TOKENS


def test_streams_one_at_a_time_equal_the_engine(server: Server, reference: LLM) -> None:
    for prompt in PROMPTS[:3]:
        assert _stream_text(server, prompt) == _greedy(reference, prompt)


def test_eight_concurrent_streams_equal_the_engine(server: Server, reference: LLM) -> None:
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        texts = list(pool.map(lambda p: _stream_text(server, p), PROMPTS))
    assert texts == [_greedy(reference, p) for p in PROMPTS]


def test_stream_chunks_share_id_and_created_and_end_with_usage(server: Server) -> None:
    stream = server.client().completions.create(
        model="demo", prompt="The module", max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    *text_chunks, last = chunks
    assert all(c.choices and c.choices[0].index == 0 for c in text_chunks)
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 6


def test_stop_string_streamed_equals_non_streamed(server: Server, reference: LLM) -> None:
    full = _greedy(reference, "The module")
    stop = full.split()[3]
    expected = _greedy(reference, "The module", stop=(stop,))
    client = server.client()
    whole = client.completions.create(model="demo", prompt="The module", max_tokens=MAX_TOKENS,
                                      temperature=0, stop=[stop])
    assert whole.choices[0].text == expected and whole.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="demo", prompt="The module",
                                         max_tokens=MAX_TOKENS, temperature=0, stop=[stop],
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected


def test_prompt_list_and_token_ids(server: Server, reference: LLM) -> None:
    client = server.client()
    out = client.completions.create(model="demo", prompt=PROMPTS[:2], max_tokens=8,
                                    temperature=0)
    params = SamplingParams(max_tokens=8, temperature=0)
    assert [c.index for c in out.choices] == [0, 1]
    assert [c.text for c in out.choices] == [o.text for o in
                                            reference.generate(PROMPTS[:2], params)]
    ids = reference.tokenizer.encode(PROMPTS[2])
    by_ids = client.completions.create(model="demo", prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == reference.generate(ids, params)[0].text


def test_chat_streaming_and_not(server: Server) -> None:
    client = server.client()
    messages = [{"role": "system", "content": "You document Python."},
                {"role": "user", "content": "What does the module do?"}]
    whole = client.chat.completions.create(model="demo", messages=messages,  # type: ignore[arg-type]
                                           max_tokens=12, temperature=0)
    assert whole.object == "chat.completion"
    message = whole.choices[0].message
    assert message.role == "assistant" and message.content
    stream = client.chat.completions.create(model="demo", messages=messages,  # type: ignore[arg-type]
                                            max_tokens=12, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_logprobs_in_openai_format(server: Server) -> None:
    client = server.client()
    out = client.completions.create(model="demo", prompt="The module", max_tokens=4,
                                    temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert "".join(lp.tokens) == out.choices[0].text
    assert len(lp.token_logprobs) == 4 and all(v <= 0 for v in lp.token_logprobs)
    assert lp.top_logprobs is not None and all(len(top) == 2 for top in lp.top_logprobs)
    chat = client.chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        temperature=0, logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs
    assert content is not None and content.content is not None and len(content.content) == 3
    first = content.content[0]
    assert len(first.top_logprobs) == 3 and first.top_logprobs[0].logprob == first.logprob


def test_unknown_fields_are_ignored(server: Server) -> None:
    out = server.client().completions.create(
        model="demo", prompt="The module", max_tokens=3, temperature=0,
        extra_body={"not_a_field": {"x": 1}, "repetition_penalty": 1.0, "priority": 1})
    assert out.choices[0].finish_reason == "length"


def test_tokenize_and_detokenize_round_trip(server: Server, reference: LLM) -> None:
    body = json.dumps({"model": "demo", "prompt": "The module"}).encode()
    status, _, raw = server.post("/tokenize", body)
    reply = json.loads(raw)
    assert status == 200 and reply["tokens"] == reference.tokenizer.encode("The module")
    assert reply["count"] == len(reply["tokens"]) and reply["max_model_len"] > 0
    status, _, raw = server.post("/detokenize", json.dumps({"tokens": reply["tokens"]}).encode())
    assert status == 200 and json.loads(raw) == {"prompt": "The module"}
    # Chat messages are rendered as /v1/chat/completions renders them.
    chat = json.dumps({"messages": [{"role": "user", "content": "Hi"}]}).encode()
    status, _, raw = server.post("/tokenize", chat)
    assert status == 200 and reference.tokenizer.decode(json.loads(raw)["tokens"]) == (
        "user: Hi\nassistant:")


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "prompt"),
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"model": "nope", "prompt": "x"}, "model"),
    ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
])
def test_tokenize_refusals_name_the_field(server: Server, path: str, body: dict[str, Any],
                                          param: str) -> None:
    status, _, reply = server.post(path, json.dumps(body).encode())
    assert 400 <= status < 500 and reply["error"]["param"] == param, reply


SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 10},
                         "kind": {"enum": ["module", "class", "function"]},
                         "args": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
          "required": ["name", "kind", "args"], "additionalProperties": False}


def test_response_format_json_schema_streamed_and_not(server: Server) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    pytest.importorskip("llguidance")
    client = server.client()
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "item", "schema": SCHEMA}}
    messages: Any = [{"role": "user", "content": "Describe one item as JSON."}]
    reply = client.chat.completions.create(model="demo", messages=messages, max_tokens=80,
                                           temperature=1.0, seed=3, response_format=fmt)
    jsonschema.validate(json.loads(reply.choices[0].message.content or ""), SCHEMA)
    pieces = client.chat.completions.create(model="demo", messages=messages, max_tokens=80,
                                            temperature=1.0, seed=3, response_format=fmt,
                                            stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    assert text == reply.choices[0].message.content
    done = client.completions.create(model="demo", prompt="JSON: ", max_tokens=80,
                                     extra_body={"guided_regex": "[a-z]{3}-[0-9]{2}"})
    assert re.fullmatch("[a-z]{3}-[0-9]{2}", done.choices[0].text)


@pytest.mark.parametrize("body", [
    {"response_format": {"type": "json_schema", "json_schema": {"schema": "{not json"}}},
    {"response_format": {"type": "json_schema"}},
    {"response_format": {"type": "yaml"}},
    {"guided_regex": "[a-z", "guided_json": {"type": "object"}},
    {"guided_regex": "[unclosed"},
])
def test_malformed_output_constraints_are_400(server: Server, body: dict[str, Any]) -> None:
    pytest.importorskip("llguidance")
    request = {"model": "demo", "messages": [{"role": "user", "content": "x"}],
               "max_tokens": 4, **body}
    status, _, reply = server.post("/v1/chat/completions", json.dumps(request).encode())
    assert status == 400 and reply["error"]["param"] == "response_format", reply


def test_n_choices_through_the_client(server: Server) -> None:
    client = server.client()
    prompt = "Return the value of"
    first = client.completions.create(model="demo", prompt=prompt, n=3, max_tokens=8,
                                      temperature=1.0, seed=11)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert first.usage is not None
    assert first.usage.prompt_tokens == len(server.tokenize(prompt))
    again = client.completions.create(model="demo", prompt=prompt, n=3, max_tokens=8,
                                      temperature=1.0, seed=11)
    assert [c.text for c in again.choices] == [c.text for c in first.choices]
    assert len({c.text for c in first.choices}) > 1
    chat = client.chat.completions.create(model="demo", n=2, max_tokens=6, stream=True,
                                          messages=[{"role": "user", "content": "Hi"}])
    seen = {c.choices[0].index for c in chat if c.choices}
    assert seen == {0, 1}
