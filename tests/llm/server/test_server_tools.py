"""Tool calls through the official ``openai`` client against a real ``llm serve``: a named
or required call constrained to the tool's schema, streamed and not; a whole
conversation (call, tool result, final answer); the Hermes-style <tool_call> format parsed
from free text; refusals naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from llm_server_helpers import Server

from turboinfer.llm.server.chat import ChatTemplate
from turboinfer.llm.server.tools import ToolPlan

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 12},
                          "unit": {"enum": ["celsius", "fahrenheit"]}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["zone"],
        "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


def test_a_named_tool_call_follows_its_schema(server: Server) -> None:
    client = server.client()
    reply = client.chat.completions.create(model="demo", messages=ASK, tools=TOOLS,
                                           tool_choice=NAMED, max_tokens=60, seed=1)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (called,) = choice.message.tool_calls or []
    assert called.type == "function" and called.function.name == "get_weather"
    assert called.id.startswith("call_")
    jsonschema.validate(json.loads(called.function.arguments), WEATHER)


def test_a_streamed_call_assembles_like_the_whole_one(server: Server) -> None:
    client = server.client()
    chunks = list(client.chat.completions.create(model="demo", messages=ASK, tools=TOOLS,
                                                 tool_choice=NAMED, max_tokens=60, seed=1,
                                                 stream=True))
    calls: dict[int, dict[str, str]] = {}
    reasons = []
    for chunk in chunks:
        for choice in chunk.choices:
            reasons.append(choice.finish_reason)
            for delta in choice.delta.tool_calls or []:
                entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
                if delta.function is not None:
                    entry["name"] += delta.function.name or ""
                    entry["arguments"] += delta.function.arguments or ""
    assert reasons[-1] == "tool_calls" and calls[0]["name"] == "get_weather"
    whole = client.chat.completions.create(model="demo", messages=ASK, tools=TOOLS,
                                           tool_choice=NAMED, max_tokens=60, seed=1)
    assert calls[0]["arguments"] == (whole.choices[0].message.tool_calls or [])[0] \
        .function.arguments


def test_required_picks_one_of_the_tools(server: Server) -> None:
    client = server.client()
    schemas = {"get_weather": WEATHER, "get_time": TIME}
    for seed in range(5):
        reply = client.chat.completions.create(model="demo", messages=ASK, tools=TOOLS,
                                               tool_choice="required", max_tokens=80,
                                               temperature=1.0, seed=seed)
        (called,) = reply.choices[0].message.tool_calls or []
        jsonschema.validate(json.loads(called.function.arguments),
                            schemas[called.function.name])


def test_a_whole_conversation_call_result_answer(server: Server) -> None:
    client = server.client()
    first = client.chat.completions.create(model="demo", messages=ASK, tools=TOOLS,
                                           tool_choice=NAMED, max_tokens=60)
    called = (first.choices[0].message.tool_calls or [])[0]
    history: Any = [*ASK,
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": called.id, "type": "function",
                         "function": {"name": called.function.name,
                                      "arguments": called.function.arguments}}]},
                    {"role": "tool", "tool_call_id": called.id, "content": "18 C, clear"}]
    for stream in (False, True):
        answer = client.chat.completions.create(model="demo", messages=history, tools=TOOLS,
                                                tool_choice="none", max_tokens=12,
                                                stream=stream)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
        else:
            text = answer.choices[0].message.content or ""
            assert answer.choices[0].finish_reason in ("stop", "length")
        assert isinstance(text, str) and text


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "response_format"),
])
def test_bad_tool_requests_are_400_naming_the_field(server: Server, body: dict[str, Any],
                                                    param: str) -> None:
    request = {"model": "demo", "messages": ASK, "max_tokens": 4, **body}
    status, _, reply = server.post("/v1/chat/completions", json.dumps(request).encode())
    assert status == 400 and reply["error"]["param"] == param, reply


def test_hermes_style_calls_are_parsed_from_free_text() -> None:
    plan = ToolPlan.from_request(TOOLS, "auto")
    assert plan is not None
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "unit": "celsius"}}\n</tool_call>')
    content, calls = plan.calls(text)
    assert content == "Let me check." and calls[0]["function"]["name"] == "get_weather"
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris",
                                                             "unit": "celsius"}
    assert plan.calls("no call here") == ("no call here", [])
    assert ToolPlan.from_request(TOOLS, "none") is None


def test_a_template_sees_the_tools_and_the_calls(tmp_path: Path) -> None:
    source = ("{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}"
              "</tools>{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
              "{% for c in m.tool_calls or [] %}[{{ c.function.name }}:"
              "{{ c.function.arguments.city }}]{% endfor %}{% endfor %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": source}))
    template = ChatTemplate.from_folder(tmp_path)
    plan = ToolPlan.from_request(TOOLS, "auto")
    assert plan is not None
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}]
    assert template.render(messages, tools=plan.tools) == (
        "<tools>get_weather;get_time;</tools><user>Weather?<assistant>[get_weather:Oslo]")


def test_a_template_without_tools_gets_the_generic_tool_prompt(tmp_path: Path) -> None:
    """A ChatML template that writes role and content only (as SmolLM2's does): the tools
    go into the system message, an earlier call into its message's content."""
    source = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": source}))
    template = ChatTemplate.from_folder(tmp_path)
    assert not template.shows_tools and not template.shows_tool_calls
    plan = ToolPlan.from_request(TOOLS, "auto")
    assert plan is not None
    text = template.render([{"role": "user", "content": "Weather?"}], tools=plan.tools)
    system, user = text.split("<|im_end|>\n")[:2]
    assert system.startswith("<|im_start|>system\nYou can call functions.")
    assert '"name": "get_weather"' in system and '"name": "get_time"' in system
    assert "<tool_call>" in system and user == "<|im_start|>user\nWeather?"
    asked = template.render([{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Weather?"},
                             {"role": "assistant", "content": "", "tool_calls": [
                                 {"id": "c1", "type": "function", "function": {
                                     "name": "get_weather", "arguments": {"city": "Oslo"}}}]},
                             {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
                            tools=plan.tools)
    assert asked.startswith("<|im_start|>system\nBe brief.\n\nYou can call functions.")
    assert ('<|im_start|>assistant\n<tool_call>{"name": "get_weather", "arguments": '
            '{"city": "Oslo"}}</tool_call><|im_end|>') in asked
    assert template.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_a_template_that_shows_tools_gets_no_generic_prompt(tmp_path: Path) -> None:
    source = ("{% if tools %}<tools>{% for t in tools %}{{ t.function.name }};{% endfor %}"
              "</tools>{% endif %}"
              "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
              "{% for c in m.tool_calls or [] %}[{{ c.function.name }}]{% endfor %}{% endfor %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": source}))
    template = ChatTemplate.from_folder(tmp_path)
    plan = ToolPlan.from_request(TOOLS, "auto")
    assert plan is not None
    assert template.shows_tools and template.shows_tool_calls
    assert template.render([{"role": "user", "content": "Weather?"}], tools=plan.tools) == (
        "<tools>get_weather;get_time;</tools><user>Weather?")
