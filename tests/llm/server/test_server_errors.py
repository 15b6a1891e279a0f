"""Every bad input gets OpenAI's error object with a 4xx, and the server keeps serving."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from llm_server_helpers import MAX_NUM_SEQS, MAX_WAITING, Server

LONG_PROMPT = "the value of a list " * 200  # far past the demo model's 512-token context
OK = {"model": "demo", "prompt": "The module", "max_tokens": 3}
OK_CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def _check_error(status: int, body: Any, expected_status: int, param: str | None) -> None:
    assert status == expected_status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    assert error["param"] == param


@pytest.mark.parametrize(("change", "status", "param"), [
    ({"model": "no-such-model"}, 404, "model"),
    ({"max_tokens": 0}, 400, "max_tokens"),
    ({"max_tokens": -5}, 400, "max_tokens"),
    ({"temperature": 2.5}, 400, "temperature"),
    ({"temperature": -0.1}, 400, "temperature"),
    ({"top_p": 0}, 400, "top_p"),
    ({"top_p": 1.5}, 400, "top_p"),
    ({"prompt": LONG_PROMPT}, 400, "prompt"),
    ({"max_tokens": 600}, 400, "max_tokens"),       # prompt + max_tokens past the context
    ({"max_tokens": "ten"}, 400, "max_tokens"),     # wrong types
    ({"prompt": 5}, 400, "prompt"),
    ({"temperature": [1]}, 400, "temperature"),
    ({"stop": 3}, 400, "stop"),
    ({"n": 0}, 400, "n"),
    ({"n": 17}, 400, "n"),
    ({"prompt": [999999]}, 400, "prompt"),          # a token id outside the vocabulary
    ({"logprobs": 50}, 400, "logprobs"),
    ({"model": None}, 400, "model"),
])
def test_bad_completion_request(server: Server, change: dict[str, Any], status: int,
                                param: str | None) -> None:
    code, _, body = server.post("/v1/completions", json.dumps({**OK, **change}).encode())
    _check_error(code, body, status, param)


@pytest.mark.parametrize(("change", "param"), [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": LONG_PROMPT}]}, "messages"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"top_logprobs": 50, "logprobs": True}, "top_logprobs"),
])
def test_bad_chat_request(server: Server, change: dict[str, Any], param: str) -> None:
    code, _, body = server.post("/v1/chat/completions", json.dumps({**OK_CHAT, **change}).encode())
    _check_error(code, body, 400, param)


DEEP_ARRAY = b"[" * 100_000 + b"]" * 100_000
DEEP_OBJECT = b'{"a":' * 100_000 + b"1" + b"}" * 100_000


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b"\xff\xfe", DEEP_ARRAY,
                                 DEEP_OBJECT])
def test_invalid_json(server: Server, path: str, raw: bytes) -> None:
    code, _, body = server.post(path, raw)
    _check_error(code, body, 400, None)


@pytest.mark.parametrize("raw", [DEEP_ARRAY, DEEP_OBJECT, b"{not json"])
def test_invalid_json_at_the_oip_generate_door(server: Server, raw: bytes) -> None:
    code, _, body = server.post("/v2/models/demo/generate", raw)
    assert code == 400 and "error" in body and "Traceback" not in str(body)


def test_the_official_client_sees_typed_errors(server: Server) -> None:
    client = server.client(max_retries=0)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="demo", prompt="x", max_tokens=2, n=0)
    assert info.value.param == "n"


def test_api_key_is_required(server: Server) -> None:
    body = json.dumps(OK).encode()
    code, _, reply = server.post("/v1/completions", body, key=None)
    _check_error(code, reply, 401, None)
    code, _, reply = server.post("/v1/completions", body, key="sk-wrong")
    assert code == 401 and reply["error"]["type"] == "authentication_error"
    with (openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong") as client,
          pytest.raises(openai.AuthenticationError)):
        client.models.list()
    assert server.get_json("/health")["status"] == "ok"  # probes need no key


def test_a_full_server_answers_429_with_retry_after(server: Server) -> None:
    client = server.client(max_retries=0)
    limit = MAX_NUM_SEQS + MAX_WAITING
    streams = [client.completions.create(model="demo", prompt="The module", max_tokens=400,
                                         temperature=0, stream=True) for _ in range(limit)]
    try:
        with pytest.raises(openai.RateLimitError) as info:
            client.completions.create(model="demo", prompt="The module", max_tokens=2)
        assert int(info.value.response.headers["retry-after"]) >= 1
        assert info.value.body["type"] == "rate_limit_error"  # type: ignore[index]
    finally:
        for stream in streams:
            stream.close()
    health = server.wait_idle()
    assert health["kv_free_blocks"] == health["kv_total_blocks"]
    again = client.completions.create(model="demo", prompt="The module", max_tokens=2)
    assert again.choices[0].finish_reason == "length"
