"""Request bodies of the OpenAI API (and the OIP generate extension), validated once.

Unknown fields are ignored, not refused: the official client's ``extra_body`` adds
arbitrary keys, and other servers' extensions must not break a request. Every refusal
is an ``InvalidInputError`` naming the field (OpenAI's ``param``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turboinfer.errors import InvalidInputError
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.engine.structured import StructuredOutput
from turboinfer.llm.server.tools import ToolPlan, template_message

M = TypeVar("M", bound=BaseModel)

# OpenAI's default for completions; chat defaults to the rest of the context.
COMPLETION_DEFAULT_MAX_TOKENS = 16
# Choices per prompt (OpenAI's n) at most: each one is a sequence in the batch.
MAX_N = 16


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchemaFormat(_Body):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str | None = None
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Sampling(_Body):
    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None  # extension; -1 or 0: off
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    priority: int = 0  # extension: lower runs first, as the engine's scheduler orders
    ignore_eos: bool = False  # extension, as in vLLM
    response_format: ResponseFormat | None = None
    # vLLM's guided-decoding extensions
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None

    def structured(self) -> StructuredOutput | None:
        """The output constraint this request asks for (at most one), its grammar checked
        here so that a malformed one is a 400 before anything is streamed."""
        asked: list[StructuredOutput] = []
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            asked.append(StructuredOutput("json_object"))
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None:
                raise InvalidInputError("response_format json_schema needs 'json_schema'",
                                        param="response_format")
            asked.append(StructuredOutput.json_schema(fmt.json_schema.schema_))
        if self.guided_json is not None:
            asked.append(StructuredOutput.json_schema(self.guided_json))
        if self.guided_regex is not None:
            asked.append(StructuredOutput("regex", self.guided_regex))
        if self.guided_grammar is not None:
            asked.append(StructuredOutput("grammar", self.guided_grammar))
        if len(asked) > 1:
            raise InvalidInputError("give one of response_format, guided_json, guided_regex "
                                    "and guided_grammar", param="response_format")
        if asked:
            asked[0].check()
        return asked[0] if asked else None

    @property
    def choices(self) -> int:
        """How many choices per prompt (``n``), within MAX_N."""
        n = 1 if self.n is None else self.n
        if not 1 <= n <= MAX_N:
            raise InvalidInputError(f"n must be in [1, {MAX_N}]", param="n")
        return n

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def sampling(self, max_tokens: int, logprobs: int | None,
                 tool_output: StructuredOutput | None = None) -> SamplingParams:
        """The request's sampling; ``tool_output`` is a tool call's own constraint."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        structured = self.structured()
        if tool_output is not None and structured is not None:
            raise InvalidInputError("a required or named tool call already fixes the "
                                    "output; drop response_format", param="response_format")
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=max(self.top_k or 0, 0), seed=self.seed, stop=stop,
            ignore_eos=self.ignore_eos, logprobs=logprobs,
            structured=tool_output or structured)


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool | None = False
    logprobs: Annotated[int, Field(ge=0)] | None = None
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise InvalidInputError("the prompt is empty", param="prompt")
        if isinstance(p[0], int):
            return [p]
        return list(p)

    def check_supported(self) -> None:
        if self.echo:
            raise InvalidInputError("echo is not supported", param="echo")
        if self.suffix:
            raise InvalidInputError("suffix is not supported", param="suffix")


class ContentPart(_Body):
    type: str
    text: str | None = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool result answers this call
    name: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template reads it."""
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        for key in ("tool_calls", "tool_call_id", "name"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        return template_message(message)

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        if any(part.type != "text" for part in self.content):
            raise InvalidInputError("only text content parts are supported",
                                    param="messages")
        return "".join(part.text or "" for part in self.content)


class ChatRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = False
    top_logprobs: Annotated[int, Field(ge=0)] | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def tool_plan(self) -> ToolPlan | None:
        return ToolPlan.from_request(self.tools, self.tool_choice)


class TokenizeRequest(_Body):
    """vLLM's ``/tokenize``: a ``prompt`` (special tokens added as the tokenizer's rules
    say) or chat ``messages`` (rendered by the template, which writes its own)."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool | None = None

    def check_one_input(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise InvalidInputError("give exactly one of prompt and messages", param="prompt")


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


class GenerateRequest(_Body):
    """The OIP generate extension (Triton's): ``text_input`` plus sampling parameters,
    either at the top level or under ``parameters``."""

    text_input: str
    max_tokens: Annotated[int, Field(ge=1)] = COMPLETION_DEFAULT_MAX_TOKENS
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=-1)] = 0
    stop: str | list[str] | None = None
    seed: int | None = None
    priority: int = 0
    ignore_eos: bool = False

    def sampling(self) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(max_tokens=self.max_tokens, temperature=self.temperature,
                              top_p=self.top_p, top_k=max(self.top_k, 0), seed=self.seed,
                              stop=stop, ignore_eos=self.ignore_eos)


def parse(model: type[M], body: bytes) -> M:
    """JSON bytes -> a validated request, or an ``InvalidInputError`` naming the field."""
    return validate(model, load_body(body))


def load_body(body: bytes) -> Any:
    """JSON bytes -> Python objects; malformed or too deeply nested JSON (orjson stops at
    1024 levels) is an ``InvalidInputError``."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"the body is not valid JSON ({exc})") from None


def validate(model: type[M], data: Any) -> M:
    if not isinstance(data, dict):
        raise InvalidInputError("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = [str(part) for part in first["loc"]]
        param = loc[0] if loc else None
        raise InvalidInputError(f"{'.'.join(loc) or 'body'}: {first['msg']}",
                                param=param) from None


@dataclass(frozen=True)
class Limits:
    """What one request may ask of this server's engine."""

    max_seq_len: int  # prompt + output tokens: the context, capped by the KV cache size
    vocab_size: int
    max_logprobs: int = 20

    def max_tokens(self, prompt_len: int, requested: int | None, default: int | None,
                   param: str) -> int:
        """The output budget for a prompt; refuses what can never fit."""
        room = self.max_seq_len - prompt_len
        if room < 1:
            raise InvalidInputError(
                f"the prompt has {prompt_len} tokens; this model holds {self.max_seq_len} "
                "tokens (its context, capped by the KV cache) including at least one "
                "generated token", param=param)
        if requested is None:
            return room if default is None else min(default, room)
        if requested > room:
            raise InvalidInputError(
                f"this model holds {self.max_seq_len} tokens; the request asks for "
                f"{prompt_len + requested} ({prompt_len} in the prompt, {requested} for the "
                "completion)", param="max_tokens")
        return requested

    def check_ids(self, ids: list[int], param: str = "prompt") -> None:
        if any(t < 0 or t >= self.vocab_size for t in ids):
            raise InvalidInputError(f"token ids must be in [0, {self.vocab_size})",
                                    param=param)

    def check_logprobs(self, n: int | None, param: str) -> None:
        if n is not None and n > self.max_logprobs:
            raise InvalidInputError(f"{param} must be <= {self.max_logprobs}", param=param)
