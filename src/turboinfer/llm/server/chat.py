"""Chat messages to one prompt string.

With a ``chat_template`` in the model folder's ``tokenizer_config.json`` (or a
``chat_template.jinja`` file beside it) the messages are rendered the way
``transformers``' ``apply_chat_template`` renders them: a sandboxed Jinja2 environment
with ``messages``, ``add_generation_prompt=True``, ``bos_token`` and ``eos_token``.
Without one (the shipped demo model is a plain language model) the fallback is one line
per message, ``"{role}: {content}\\n"``, followed by ``"assistant:"`` to cue the reply.

Many templates (SmolLM2's, Llama 2's, Gemma's) never show the ``tools`` they are given, nor
an assistant message's ``tool_calls``. For those, found once by rendering a probe, the
tools go into the system message as a generic prompt (the function schemas and the
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` format the tool parser reads,
as llama.cpp's server does for templates without tool support), and earlier calls into
their message's content in that format, so the model sees what it was offered and what it
called.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from turboinfer.errors import InvalidInputError, ModelLoadError
from turboinfer.llm.tokenizer import token_text

Message = dict[str, Any]


def _pick_template(value: Any) -> str | None:
    if isinstance(value, list):  # named templates: use "default"
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) and value else None


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._compiled: Any = None
        self._shows: tuple[bool, bool] | None = None   # (tools, tool calls), probed once
        self._errors: tuple[type[Exception], ...] = (_TemplateRaised,)
        if source is not None:
            # jinja2 only for a model that ships a template (transformers' chat needs it too).
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            self._errors = (TemplateError, _TemplateRaised)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            env.filters["tojson"] = lambda v, **kw: json.dumps(v, ensure_ascii=False, **kw)
            try:
                self._compiled = env.from_string(source)
            except self._errors as exc:
                raise ModelLoadError(f"chat template does not compile: {exc}") from None

    @classmethod
    def from_folder(cls, folder: Path) -> ChatTemplate:
        config: dict[str, Any] = {}
        path = folder / "tokenizer_config.json"
        if path.is_file():
            try:
                config = json.loads(path.read_text())
            except json.JSONDecodeError as exc:
                raise ModelLoadError(f"{path}: not valid JSON ({exc.msg})") from None
        source = _pick_template(config.get("chat_template"))
        jinja_file = folder / "chat_template.jinja"
        if source is None and jinja_file.is_file():
            source = jinja_file.read_text()
        return cls(source, bos_token=token_text(config.get("bos_token")) or "",
                   eos_token=token_text(config.get("eos_token")) or "")

    def render(self, messages: list[Message], tools: list[dict[str, Any]] | None = None
               ) -> str:
        if self._compiled is None:
            return _fallback(messages, tools)
        if not self.shows_tool_calls:
            messages = [_calls_in_content(m) for m in messages]
        if tools and not self.shows_tools:
            messages, tools = _with_tool_prompt(messages, tools), None
        return self._render(messages, tools)

    @property
    def shows_tools(self) -> bool:
        """Whether the template writes the tools it is given into the prompt."""
        return self._probe()[0]

    @property
    def shows_tool_calls(self) -> bool:
        """Whether the template writes an assistant message's tool calls."""
        return self._probe()[1]

    def _probe(self) -> tuple[bool, bool]:
        """Renders a probe tool and a probe call once: does either reach the text?"""
        if self._shows is not None:
            return self._shows
        tool: dict[str, Any] = {"type": "function", "function": {
            "name": _PROBE, "description": _PROBE,
            "parameters": {"type": "object", "properties": {_PROBE: {"type": "string"}}}}}
        user: Message = {"role": "user", "content": "hello"}
        called: Message = {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": _PROBE, "arguments": {_PROBE: _PROBE}}}]}
        result: Message = {"role": "tool", "tool_call_id": "call_0", "content": "done"}
        probes: list[tuple[list[Message], list[dict[str, Any]] | None]] = [
            ([user], [tool]), ([user, called, result], None)]
        shown = []
        for messages, tools in probes:
            try:
                shown.append(_PROBE in self._render(messages, tools))
            except InvalidInputError:   # a template that refuses tool messages
                shown.append(False)
        self._shows = (shown[0], shown[1])
        return self._shows

    def _render(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
        try:
            text: str = self._compiled.render(
                messages=messages, add_generation_prompt=True, bos_token=self.bos_token,
                eos_token=self.eos_token, tools=tools)
        except self._errors as exc:
            raise InvalidInputError(f"the chat template refused the messages: {exc}",
                                    param="messages") from None
        return text


def _fallback(messages: list[Message], tools: list[dict[str, Any]] | None) -> str:
    """One line per message (the tools first, calls in the <tool_call> tags the tool
    parser reads), then ``assistant:``."""
    lines = [f"tools: {json.dumps(tools)}"] if tools else []
    for m in messages:
        calls = "".join(f"<tool_call>{json.dumps(c.get('function', {}))}</tool_call>"
                        for c in m.get("tool_calls") or [])
        lines.append(f"{m['role']}: {m.get('content') or ''}{calls}")
    return "".join(line + "\n" for line in lines) + "assistant:"


_PROBE = "ti_probe_9f3c"   # a name no template writes by itself

TOOL_PROMPT = (
    "You can call functions. Their JSON schemas:\n{functions}\n\n"
    "To call one, answer with <tool_call>{{\"name\": \"the function's name\", "
    "\"arguments\": {{its arguments as a JSON object}}}}</tool_call> and nothing else; "
    "its result comes back in the next message. When no function helps, answer in text.")


def _with_tool_prompt(messages: list[Message], tools: list[dict[str, Any]]) -> list[Message]:
    """The generic tool prompt, in the system message (a new one when there is none)."""
    functions = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    prompt = TOOL_PROMPT.format(functions=functions)
    if messages and messages[0].get("role") == "system":
        first = messages[0]
        content = first.get("content") or ""
        return [{**first, "content": f"{content}\n\n{prompt}" if content else prompt},
                *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def _calls_in_content(message: Message) -> Message:
    """An assistant message's tool calls written into its content, in the <tool_call>
    format the generic tool prompt teaches."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    text = "".join(
        "<tool_call>" + json.dumps({"name": c.get("function", {}).get("name"),
                                    "arguments": c.get("function", {}).get("arguments")},
                                   ensure_ascii=False) + "</tool_call>"
        for c in calls)
    return {**message, "content": (message.get("content") or "") + text}


class _TemplateRaised(Exception):
    """A template's own ``raise_exception(...)``: it refuses these messages."""


def _raise(message: str) -> None:
    raise _TemplateRaised(message)
