"""Tool calls: OpenAI's ``tools`` and ``tool_choice`` on /v1/chat/completions.

- ``tool_choice`` naming a function: the output is constrained (``llm.structured``) to
  JSON following that function's ``parameters`` schema, and becomes its arguments;
- ``"required"``: constrained to ``{"name": ..., "arguments": {...}}`` for one of the
  tools (their schemas in an ``anyOf``);
- ``"auto"`` (the default with tools): the model writes freely, and calls in its own
  format are parsed from the text: ``<tool_call>{"name": ..., "arguments": ...}
  </tool_call>``, as Hermes-style templates (Qwen2.5, Hermes, SmolLM3 and others) teach
  their models; text outside the tags stays the message's content;
- ``"none"``: the tools are not offered.

The tools reach the chat template as its ``tools`` variable, and earlier turns' calls and
results as the messages' ``tool_calls`` (arguments parsed back to objects, as the
templates expect) and ``tool_call_id``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from turboinfer.errors import InvalidInputError
from turboinfer.llm.engine.structured import StructuredOutput

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
Mode = Literal["auto", "required", "named"]


@dataclass(frozen=True)
class ToolPlan:
    mode: Mode
    functions: tuple[dict[str, Any], ...]  # each tool's "function" object
    name: str | None = None  # the function tool_choice names

    @classmethod
    def from_request(cls, tools: list[dict[str, Any]] | None, choice: Any) -> ToolPlan | None:
        if choice == "none" or (not tools and choice in (None, "auto")):
            return None
        if not tools:
            raise InvalidInputError("tool_choice needs tools", param="tool_choice")
        functions = tuple(_function(t) for t in tools)
        names = [f["name"] for f in functions]
        if choice in (None, "auto"):
            return cls("auto", functions)
        if choice == "required":
            return cls("required", functions)
        name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        if name not in names:
            raise InvalidInputError(f"tool_choice names {name!r}, which is not among the "
                                    f"tools ({', '.join(names)})", param="tool_choice")
        return cls("named", functions, name)

    @property
    def tools(self) -> list[dict[str, Any]]:
        """As the chat template's ``tools`` variable takes them."""
        return [{"type": "function", "function": f} for f in self.functions]

    def structured(self) -> StructuredOutput | None:
        if self.mode == "named":
            return StructuredOutput.json_schema(self._parameters(self.name))
        if self.mode == "required":
            return StructuredOutput.json_schema({"anyOf": [
                {"type": "object", "additionalProperties": False,
                 "required": ["name", "arguments"],
                 "properties": {"name": {"enum": [f["name"]]},
                                "arguments": self._parameters(f["name"])}}
                for f in self.functions]})
        return None

    def calls(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The message's content and tool calls from the generated text."""
        if self.mode == "named":
            assert self.name is not None
            return None, [call(self.name, text)]
        if self.mode == "required":
            found = _load(text)
            if isinstance(found, dict) and "name" in found:
                return None, [call(str(found["name"]), json.dumps(found.get("arguments", {})))]
            return text, []  # cut short (max_tokens) before the call was complete
        calls = []
        for match in TOOL_CALL.finditer(text):
            found = _load(match.group(1))
            if isinstance(found, dict) and isinstance(found.get("name"), str):
                arguments = found.get("arguments", found.get("parameters", {}))
                calls.append(call(found["name"], arguments if isinstance(arguments, str)
                                  else json.dumps(arguments)))
        if not calls:
            return text, []
        content = TOOL_CALL.sub("", text).strip()
        return content or None, calls

    def _parameters(self, name: str | None) -> dict[str, Any]:
        function = next(f for f in self.functions if f["name"] == name)
        parameters = function.get("parameters") or {"type": "object"}
        return dict(parameters)


def call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message as templates read it: a call's arguments as an object."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    out = []
    for c in calls:
        function = dict(c.get("function") or {})
        if isinstance(function.get("arguments"), str):
            parsed = _load(function["arguments"])
            function["arguments"] = parsed if parsed is not None else function["arguments"]
        out.append({**c, "function": function})
    return {**message, "tool_calls": out}


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type") != "function" or not isinstance(function, dict) \
            or not isinstance(function.get("name"), str) or not function["name"]:
        raise InvalidInputError("each tool must be {\"type\": \"function\", \"function\": "
                                "{\"name\": ...}}", param="tools")
    if not isinstance(function.get("parameters", {}), dict):
        raise InvalidInputError(f"tool {function['name']!r}: parameters must be a JSON "
                                "schema object", param="tools")
    return function


def _load(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None
