"""Prompt sets: random prompts of exactly the asked length, real stdlib text, the body sent."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from turboinfer.errors import ConfigError
from turboinfer.load.openai.prompts import (
    PromptRequest,
    load_tokenizer,
    random_prompts,
    stdlib_prompts,
)
from turboinfer.load.openai.protocol import request_body
from turboinfer.load.openai.settings import EndpointKind, LoadSettings


def test_random_prompts_have_the_exact_length_and_are_seeded() -> None:
    tok = load_tokenizer(None)
    prompts = random_prompts(tok, 8, 64, 16, seed=1)
    for p in prompts:
        assert len(tok.encode(p.prompt, add_special_tokens=False).ids) == p.prompt_len == 64
        assert p.output_len == 16
    assert prompts == random_prompts(tok, 8, 64, 16, seed=1)
    assert prompts != random_prompts(tok, 8, 64, 16, seed=2)


@pytest.mark.slow
def test_stdlib_prompts_are_real_text_cut_at_a_token_boundary() -> None:
    tok = load_tokenizer(None)
    prompts = stdlib_prompts(tok, 5, 32, 8, seed=0)
    assert len({p.prompt for p in prompts}) == 5
    for p in prompts:
        assert 0 < p.prompt_len <= 32
        assert len(tok.encode(p.prompt, add_special_tokens=False).ids) == p.prompt_len
        assert " " in p.prompt  # prose, not token soup


def test_bodies_for_both_endpoints() -> None:
    prompt = PromptRequest("Hello there", 2, 5)
    body = orjson.loads(request_body(LoadSettings(url="x", extra_body={"top_k": 1}), "m",
                                     prompt))
    assert body == {"model": "m", "prompt": "Hello there", "max_tokens": 5,
                    "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}, "ignore_eos": True,
                    "min_tokens": 5, "top_k": 1}
    chat = orjson.loads(request_body(LoadSettings(url="x", endpoint=EndpointKind.CHAT,
                                                  ignore_eos=False), None, prompt))
    assert chat["messages"] == [{"role": "user", "content": "Hello there"}]
    assert "model" not in chat and "ignore_eos" not in chat and "min_tokens" not in chat


def test_missing_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path)
