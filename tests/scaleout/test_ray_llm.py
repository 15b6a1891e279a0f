"""``turboinfer llm serve --ray``: two replicas of the OpenAI-compatible server behind
Ray's one HTTP door, driven by the official ``openai`` client (the shipped demo model)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from turboinfer.llm import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The module", "def read(", "Return the", "import os\n", "class Foo", "If the file"]
MAX_TOKENS = 12


def _ready_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()),  # type: ignore[union-attr]
                              daemon=True)
    reader.start()
    reader.join(timeout_s)
    return lines[0].strip() if lines else ""


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("ray-llm") / "server.log"
    with log.open("w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "turboinfer", "llm", "serve", "--ray", "--replicas", "2",
             "--ray-cpus", "2", "--port", "0", "--threads", "1", "--kv-cache-tokens", "2048",
             "--max-num-seqs", "4"],
            stdout=subprocess.PIPE, stderr=err, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        line = _ready_line(process, timeout_s=300)
        if not line.startswith("turboinfer llm serving"):
            pytest.fail(f"server did not start: {line!r}\n{log.read_text()[-3000:]}")
        yield "http://" + re.search(r"http=(\S+)", line).group(1)  # type: ignore[union-attr]
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(90)
        assert process.stdout is not None
        process.stdout.close()
    assert code == 0
    # Announced on stderr after the ready line: two replicas, no autoscaling.
    assert "2..2 replicas" in log.read_text()


@pytest.fixture(scope="module")
def reference() -> LLM:
    return LLM()


def _greedy(reference: LLM, prompt: str) -> str:
    return reference.generate(prompt, SamplingParams(max_tokens=MAX_TOKENS,
                                                     temperature=0))[0].text


def test_openai_client_against_the_replicas(url: str, reference: LLM) -> None:
    with openai.OpenAI(base_url=f"{url}/v1", api_key="unused") as client:
        _ask_the_replicas(client, reference)


def _ask_the_replicas(client: openai.OpenAI, reference: LLM) -> None:
    assert [m.id for m in client.models.list().data] == ["demo"]
    whole = client.completions.create(model="demo", prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                      temperature=0)
    assert whole.choices[0].text == _greedy(reference, PROMPTS[0])

    def stream(prompt: str) -> str:
        chunks = client.completions.create(model="demo", prompt=prompt,
                                           max_tokens=MAX_TOKENS, temperature=0, stream=True)
        return "".join(chunk.choices[0].text for chunk in chunks)

    # More streams than one replica's batch slots: both replicas answer, each with the
    # very text the engine gives alone.
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        texts = list(pool.map(stream, PROMPTS))
    assert texts == [_greedy(reference, p) for p in PROMPTS]
    chat = client.chat.completions.create(model="demo", max_tokens=4, temperature=0,
                                          messages=[{"role": "user", "content": "Hello"}])
    assert chat.choices[0].message.content
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x", max_tokens=2)


def test_replicas_plan_autoscales_on_waiting_requests() -> None:
    from turboinfer.scaleout.ray_llm import LLMReplicas  # why: imports ray (the extra)

    fixed = LLMReplicas(replicas=2, max_replicas=2).deployment_options(8, 16)
    assert fixed["num_replicas"] == 2 and "autoscaling_config" not in fixed
    scaling = LLMReplicas(replicas=1, max_replicas=3).deployment_options(8, 16)
    config = scaling["autoscaling_config"]
    # Above 8 requests per replica, requests wait for a batch slot: add a replica.
    assert config["target_ongoing_requests"] == 8
    assert (config["min_replicas"], config["max_replicas"]) == (1, 3)
    assert scaling["max_ongoing_requests"] == 8 + 16
