"""The server's parts in-process: text streaming, chat templates, the engine loop's
timeout and priority."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from turboinfer.llm import LLM, EngineConfig, SamplingParams
from turboinfer.llm.server.chat import ChatTemplate
from turboinfer.llm.server.generation import Generation, RequestTimeoutError
from turboinfer.llm.server.server import build_state
from turboinfer.llm.server.settings import ServerSettings
from turboinfer.llm.server.textstream import TextStream

LONG = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("text", ["naïve café — 東京 🙂 done", "a\nb  c\td", "ÿ" * 7])
def test_text_stream_pieces_concatenate_to_the_whole(reference: LLM, text: str) -> None:
    tok = reference.tokenizer
    ids = tok.encode(text)
    stream = TextStream(tok, ())
    pieces = [stream.push([i]) for i in ids]
    assert all("\ufffd" not in p for p in pieces)  # never half a character
    assert "".join(pieces) + stream.finish(tok.decode(ids)) == tok.decode(ids)


def test_text_stream_holds_back_a_possible_stop_string(reference: LLM) -> None:
    tok = reference.tokenizer
    stream = TextStream(tok, ("STOP",))
    shown = "".join(stream.push([i]) for i in tok.encode("the end ST"))
    assert "S" not in shown and "the end".startswith(shown.rstrip())
    assert shown + stream.finish("the end ") == "the end "


def test_chat_fallback_without_a_template(tmp_path: Path) -> None:
    template = ChatTemplate.from_folder(tmp_path)
    text = template.render([{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "Hi"}])
    assert text == "system: Be brief.\nuser: Hi\nassistant:"


def test_chat_template_from_tokenizer_config(tmp_path: Path) -> None:
    source = ("{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>"
              "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": source, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}))
    template = ChatTemplate.from_folder(tmp_path)
    messages = [{"role": "user", "content": "Hi"}]
    assert template.render(messages) == "<s><|user|>Hi</s><|assistant|>"


async def _run_generation(llm: LLM, settings: ServerSettings, prompt: list[int],
                          params: SamplingParams, priority: int = 0, n: int = 1,
                          stream: bool = True) -> Generation:
    state = build_state(llm, settings, Path("."), asyncio.get_running_loop())
    state.loop.start()
    try:
        gen = Generation(state, [prompt], params, priority=priority, stream=stream,
                         arrival=time.perf_counter(), n=n)
        try:
            await gen.wait()
        finally:
            gen.close()
        return gen
    finally:
        await asyncio.sleep(0)
        state.loop.stop()


def test_a_request_past_its_timeout_is_aborted(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024))
    settings = ServerSettings(request_timeout_s=0.001)
    prompt = llm.tokenizer.encode("the value of a list")
    with pytest.raises(RequestTimeoutError):
        asyncio.run(_run_generation(llm, settings, prompt, LONG))
    assert not llm.engine.has_unfinished()
    assert llm.engine.block_manager.num_used_blocks == 0


def test_priority_reaches_the_scheduler(tiny_llm_dir: Path) -> None:
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024))
    prompt = llm.tokenizer.encode("the value")
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    gen = asyncio.run(_run_generation(llm, ServerSettings(), prompt, params, priority=-3))
    seq = gen.results[0]
    assert seq is not None and seq.priority == -3 and seq.num_output_tokens == 3


@pytest.mark.parametrize("stream", [True, False])
def test_n_choices_share_the_prompt_blocks(tiny_llm_dir: Path, stream: bool) -> None:
    """The further choices join after the first choice's prefill: every full prompt block
    of theirs comes from the prefix cache."""
    llm = LLM(tiny_llm_dir, config=EngineConfig(kv_cache_tokens=1024))
    prompt = llm.tokenizer.encode("the value of a list " * 12)
    blocks = (len(prompt) - 1) // llm.config.block_size
    assert blocks >= 2
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=7, ignore_eos=True)
    gen = asyncio.run(_run_generation(llm, ServerSettings(), prompt, params, n=3,
                                      stream=stream))
    seqs = [s for s in gen.results if s is not None]
    assert len(seqs) == 3 and all(s.num_output_tokens == 4 for s in seqs)
    assert [s.params.seed for s in seqs] == [7, 8, 9]  # the choices differ, repeatably
    assert llm.engine.block_manager.prefix_hits >= 2 * blocks
    assert gen.prompt_tokens == len(prompt)
