"""Chat messages to one prompt string.

With a ``chat_template`` in the model folder's ``tokenizer_config.json`` (or a
``chat_template.jinja`` file beside it) the messages are rendered the way
``transformers``' ``apply_chat_template`` renders them: a sandboxed Jinja2 environment
with ``messages``, ``add_generation_prompt=True``, ``bos_token`` and ``eos_token``.
Without one (the shipped demo model is a plain language model) the fallback is one line
per message, ``"{role}: {content}\\n"``, followed by ``"assistant:"`` to cue the reply.
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


class _TemplateRaised(Exception):
    """A template's own ``raise_exception(...)``: it refuses these messages."""


def _raise(message: str) -> None:
    raise _TemplateRaised(message)
