"""The one-call batch-1 decode step (``NativeDecoder``, decode.c) against the lean step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from turboinfer.llm.backends.base import StepItem
from turboinfer.llm.backends.cpu import kernel_candidates, prefetch
from turboinfer.llm.backends.cpu.kernels import select_kernels
from turboinfer.llm.backends.cpu.native import native_status
from turboinfer.llm.backends.cpu.native_decode import NativeDecoder
from turboinfer.llm.backends.runner import ModelRunner
from turboinfer.llm.backends.torch.lean_decode import LeanDecoder
from turboinfer.llm.engine.llm_engine import LLMEngine
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.model.config import EngineConfig, QuantMode
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.loader import load_model


@pytest.fixture()
def native_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the native kernels are offered, so the measurement has to pick them."""
    if native_status().library is None:
        pytest.skip(f"native kernels absent: {native_status().reason}")
    monkeypatch.setattr(kernel_candidates, "_torch_candidates", lambda mode, group: [])


def _native_model(folder: Path, mode: QuantMode) -> LlamaModel:
    model = load_model(folder)
    select_kernels(model, mode, measure=True)
    return model


def _decode(runner: ModelRunner, prompt: list[int], table: list[int], steps: int,
            ) -> tuple[list[int], list[torch.Tensor]]:
    feed, start, ids, logits = prompt, 0, [], []
    for _ in range(steps):
        out = runner.run([StepItem(feed, start, table, 1)])
        start += len(feed)
        feed = [int(out[0].argmax())]
        ids.append(feed[0])
        logits.append(out[0])
    return ids, logits


@pytest.mark.parametrize("mode", [QuantMode.NONE, QuantMode.INT8, QuantMode.INT4, QuantMode.Q8])
@pytest.mark.parametrize("table", [[0, 1, 2, 3, 4, 5, 6, 7], [3, 0, 5, 1, 4, 2, 7, 6]],
                         ids=["consecutive", "scattered"])
def test_native_step_matches_the_lean_step(tiny_llama_dir: Path, native_only: None,
                                           mode: QuantMode, table: list[int]) -> None:
    """Same greedy ids, logits and cache contents up to float rounding (C attention,
    norms and activation round differently from torch's). Where activations are
    quantized, a last-bit difference before a layer can move one activation across a
    rounding edge, one int8 step: on a Zen 4 one of the 14 q8 steps differed by 0.0067
    (the rest by 1e-6), hence the wider tolerance there."""
    tol = 1e-4 if mode is QuantMode.NONE else 2e-2
    model = _native_model(tiny_llama_dir, mode)
    block_size = 4
    native = ModelRunner(model, model.allocate_kv_cache(8, block_size))
    lean = ModelRunner(model, model.allocate_kv_cache(8, block_size), native_decode=False)
    prompt = [(7 * j + 3) % 128 for j in range(9)]
    native_ids, native_logits = _decode(native, prompt, table, 14)
    lean_ids, lean_logits = _decode(lean, prompt, table, 14)
    assert isinstance(native._lean, NativeDecoder) and isinstance(lean._lean, LeanDecoder)
    assert native_ids == lean_ids
    for a, b in zip(native_logits, lean_logits, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=tol)
    torch.testing.assert_close(native.kv_cache.k, lean.kv_cache.k, rtol=1e-4, atol=tol)
    torch.testing.assert_close(native.kv_cache.v, lean.kv_cache.v, rtol=1e-4, atol=tol)


def test_native_step_needs_native_kernels_in_every_layer(tiny_model: LlamaModel) -> None:
    """The loaded model's plain ``nn.Linear`` layers: no native step, the lean one runs."""
    cache = tiny_model.allocate_kv_cache(4, 4)
    assert NativeDecoder.build(tiny_model, cache) is None
    runner = ModelRunner(tiny_model, cache)
    runner.run([StepItem([5, 6, 7], 0, [0, 1], 1)])
    runner.run([StepItem([8], 3, [0, 1], 1)])
    assert isinstance(runner._lean, LeanDecoder) and not runner.native_decode


def test_without_the_library_the_lean_step_runs(tiny_llama_dir: Path, native_only: None,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    model = _native_model(tiny_llama_dir, QuantMode.INT8)
    monkeypatch.setenv("TURBOINFER_NATIVE_KERNELS", "0")
    cache = model.allocate_kv_cache(4, 4)
    assert NativeDecoder.build(model, cache) is None
    runner = ModelRunner(model, cache)
    ids, _ = _decode(runner, [5, 6, 7], [0, 1, 2, 3], 4)
    assert len(ids) == 4 and isinstance(runner._lean, LeanDecoder)


def test_switching_the_native_step_off_and_on(tiny_llama_dir: Path, native_only: None) -> None:
    model = _native_model(tiny_llama_dir, QuantMode.INT4)
    runner = ModelRunner(model, model.allocate_kv_cache(4, 4))
    runner.run([StepItem([5, 6, 7], 0, [0, 1], 1)])
    runner.run([StepItem([8], 3, [0, 1], 1)])
    assert isinstance(runner._lean, NativeDecoder)
    runner.native_decode = False
    runner.run([StepItem([9], 4, [0, 1], 1)])
    assert isinstance(runner._lean, LeanDecoder)
    runner.native_decode = True
    runner.run([StepItem([10], 5, [0, 1], 1)])
    assert isinstance(runner._lean, NativeDecoder)


@pytest.mark.parametrize("mode", [QuantMode.NONE, QuantMode.INT8])
def test_native_step_of_several_tokens_matches_the_packed_path(
        tiny_llama_dir: Path, native_only: None, mode: QuantMode) -> None:
    """A speculative verification: several new tokens after a cached prefix, logits for
    each (and for none: a draft's catch-up); row i sees the cache and rows up to i."""
    model = _native_model(tiny_llama_dir, mode)
    table = [2, 0, 3, 1, 5, 4]
    native = ModelRunner(model, model.allocate_kv_cache(6, 4))
    packed = ModelRunner(model, model.allocate_kv_cache(6, 4), lean_decode=False)
    prompt, more = [(5 * j + 1) % 128 for j in range(7)], [9, 40, 77, 3, 12]
    outs = []
    for runner in (native, packed):
        runner.run([StepItem(prompt, 0, table, 1)])
        got = runner.run([StepItem(more, len(prompt), table, len(more))])
        none = runner.run([StepItem([8, 8], len(prompt) + len(more), table, 0)])
        outs.append(got)
        assert got.shape == (len(more), model.config.vocab_size)
        assert none.shape == (0, model.config.vocab_size)
    assert native.num_forwards == packed.num_forwards == 3
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(native.kv_cache.k, packed.kv_cache.k, rtol=1e-4, atol=1e-4)


def test_a_table_too_short_for_the_tokens_is_refused(tiny_llama_dir: Path,
                                                     native_only: None) -> None:
    model = _native_model(tiny_llama_dir, QuantMode.INT8)
    decoder = NativeDecoder.build(model, model.allocate_kv_cache(4, 4))
    assert decoder is not None
    with pytest.raises(ValueError, match="no block for position 4"):
        decoder.forward([1, 2, 3, 4, 5], 0, [0], 1)


@pytest.mark.parametrize("mode", [QuantMode.INT4, QuantMode.NONE])
def test_greedy_steps_in_one_call_match_step_by_step(tiny_llama_dir: Path, native_only: None,
                                                     mode: QuantMode) -> None:
    """A draft's proposal (catch-up feed, then its own argmax fed back) in one C call:
    the tokens and cache writes of calling ``forward`` and argmax step by step."""
    model = _native_model(tiny_llama_dir, mode)
    table = [1, 4, 0, 2, 3]
    one_call = NativeDecoder.build(model, model.allocate_kv_cache(5, 4))
    stepped = NativeDecoder.build(model, model.allocate_kv_cache(5, 4))
    assert one_call is not None and stepped is not None and one_call.can_run_greedy()
    prompt = [(3 * j + 2) % 128 for j in range(6)]
    got = one_call.greedy(prompt, 0, table, 5)
    got += one_call.greedy(got[-1:], len(prompt) + 4, table, 3)
    want, feed, start = [], prompt, 0
    while len(want) < 8:
        want.append(int(stepped.forward(feed, start, table, 1)[0].argmax()))
        start += len(feed)
        feed = want[-1:]
    assert got == want
    torch.testing.assert_close(one_call.kv_cache.k, stepped.kv_cache.k)
    with pytest.raises(ValueError, match="block for position"):
        one_call.greedy([1], 19, table, 3)
    with pytest.raises(ValueError, match="token ids must be"):
        one_call.greedy([-1], 0, table, 1)


@pytest.mark.parametrize("mode", [QuantMode.NONE, QuantMode.INT8])
def test_greedy_rows_are_the_argmax_of_every_row_of_forward(tiny_llama_dir: Path,
                                                           native_only: None,
                                                           mode: QuantMode) -> None:
    """A plain greedy step (one row) and a verification (several) in one C call: each
    row's argmax of ``forward``'s logits, the same cache writes, a short table refused."""
    model = _native_model(tiny_llama_dir, mode)
    table = [2, 0, 4, 1, 3]
    fused = NativeDecoder.build(model, model.allocate_kv_cache(5, 4))
    plain = NativeDecoder.build(model, model.allocate_kv_cache(5, 4))
    assert fused is not None and plain is not None
    prompt = [(5 * j + 1) % 128 for j in range(7)]
    start = 0
    for feed in (prompt, [9], [17, 4, 88, 2, 60, 31], [5]):
        got = fused.greedy_rows(feed, start, table)
        logits = plain.forward(feed, start, table, len(feed))
        assert got == logits.argmax(dim=-1).tolist()
        start += len(feed)
    torch.testing.assert_close(fused.kv_cache.k, plain.kv_cache.k, rtol=0, atol=0)
    torch.testing.assert_close(fused.kv_cache.v, plain.kv_cache.v, rtol=0, atol=0)
    with pytest.raises(ValueError, match="block for position"):
        fused.greedy_rows([1, 2], 19, table)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 128\), got 5..128"):
        fused.greedy_rows([5, 128], 0, table)


def test_the_engine_decodes_a_lone_greedy_sequence_through_greedy_rows(
        tiny_llama_dir: Path, native_only: None) -> None:
    """Plain greedy decoding of one request takes the one-call path (no logits come
    back) and gives the tokens the logits path gives; logprobs keep the logits path."""
    engine = LLMEngine(_native_model(tiny_llama_dir, QuantMode.NONE),
                       EngineConfig(block_size=4, num_blocks=32, num_threads=1,
                                    decode_burst_ms=0))
    prompt = [(7 * j + 3) % 128 for j in range(9)]
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    with_logprobs = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=0)
    runner = engine.runner
    calls: list[int] = []
    original = runner.greedy_rows

    def counted(item: StepItem) -> list[int] | None:
        calls.append(len(item.token_ids))
        return original(item)

    runner.greedy_rows = counted  # type: ignore[method-assign]

    def generate(params: SamplingParams) -> list[int]:
        seq = engine.add_request(prompt, params)
        while engine.has_unfinished():
            engine.step()
        return list(seq.output_token_ids)

    fused = generate(greedy)
    assert calls and set(calls) == {1}      # every decode step took it
    calls.clear()
    logits_path = generate(with_logprobs)
    assert not calls
    assert fused == logits_path


def test_a_lone_greedy_sequence_decodes_in_bursts_with_the_same_tokens(
        tiny_llama_dir: Path, native_only: None) -> None:
    """Alone, a greedy request runs several steps per native call (ModelRunner.
    greedy_steps) and gets the tokens one step at a time gives, to its token limit and
    to a stop token in the middle of a burst; beside another request it steps one token
    at a time."""
    model = _native_model(tiny_llama_dir, QuantMode.NONE)
    prompt = [(7 * j + 3) % 128 for j in range(9)]

    def engine(burst_ms: float) -> LLMEngine:
        return LLMEngine(model, EngineConfig(block_size=4, num_blocks=64, num_threads=1,
                                             decode_burst_ms=burst_ms))

    def generate(eng: LLMEngine, params: SamplingParams, others: int = 0) -> list[int]:
        seq = eng.add_request(prompt, params)
        for i in range(others):
            eng.add_request([(5 * j + i) % 128 for j in range(6)], params)
        while eng.has_unfinished():
            eng.step()
        return list(seq.output_token_ids)

    greedy = SamplingParams(max_tokens=13, temperature=0, ignore_eos=True)
    one_at_a_time = generate(engine(0), greedy)
    bursting = engine(1e3)      # one burst as long as the engine allows
    steps: list[int] = []
    original = bursting.runner.greedy_steps

    def counted(item: StepItem, n: int) -> list[int] | None:
        steps.append(n)
        return original(item, n)

    bursting.runner.greedy_steps = counted  # type: ignore[method-assign]
    assert generate(bursting, greedy) == one_at_a_time
    assert steps and max(steps) > 1 and sum(steps) <= 12   # the first token is the prompt's
    stop = SamplingParams(max_tokens=13, temperature=0, stop_token_ids=(one_at_a_time[5],))
    assert generate(bursting, stop) == one_at_a_time[:one_at_a_time.index(one_at_a_time[5]) + 1]
    steps.clear()
    assert generate(bursting, greedy, others=1) == one_at_a_time
    assert not steps


def test_fp32_layers_without_a_native_pick_get_their_own(tiny_llama_dir: Path,
                                                         native_only: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Picks made among torch kernels only (as a noisy timing may make them): the native
    step still runs, on native kernels built from the layers' fp32 weights."""
    monkeypatch.undo()
    monkeypatch.setattr(kernel_candidates, "_native_candidates", lambda *args: [])
    model = _native_model(tiny_llama_dir, QuantMode.NONE)
    monkeypatch.undo()
    decoder = NativeDecoder.build(model, model.allocate_kv_cache(8, 4))
    assert decoder is not None and len(decoder.own_kernels) == 4 * len(model.layers)
    native = ModelRunner(model, model.allocate_kv_cache(8, 4))
    lean = ModelRunner(model, model.allocate_kv_cache(8, 4), native_decode=False)
    table = list(range(8))
    native_ids, native_logits = _decode(native, [3, 9, 27, 81, 5], table, 10)
    lean_ids, lean_logits = _decode(lean, [3, 9, 27, 81, 5], table, 10)
    assert native.decode_path() == "native" and lean.decode_path() == "lean"
    assert native_ids == lean_ids
    torch.testing.assert_close(native_logits[-1], lean_logits[-1], rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module", params=[torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def half_llama_dir(request: pytest.FixtureRequest,
                   tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llm_helpers import save_random_hf_model

    return save_random_hf_model(tmp_path_factory.mktemp("half_llama"), seed=5,
                                dtype=request.param)


def test_a_half_precision_checkpoint_decodes_on_16_bit_weights_to_the_fp32_bits(
        half_llama_dir: Path, native_only: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint saved in bf16 or fp16 is widened to fp32 at load; its layers' weights
    are exactly 16-bit numbers, so the native step keeps them in 16 bits (the candidate
    is measured beside the fp32 kernel; where the picks hold no native kernel the step
    builds its own in 16 bits) and decodes to the fp32 kernels' logits bit for bit."""
    library = native_status().library
    assert library is not None
    before = library.set_prefetch(-1, "f32")
    prompt, table = [3, 9, 27, 81, 5], list(range(8))
    try:
        if library.f32_wide:     # the fp32 kernel's several rows in the half kernel's order
            library.set_prefetch(library.f32_wide_from, "f32")
        model = load_model(half_llama_dir)
        choices = select_kernels(model, QuantMode.NONE)
        half = {"fp32_native_bf16_weights", "fp32_native_fp16_weights"}
        assert all(half & set(c.timings_ms) for c in choices if c.rows == 1)
        runs = {}
        monkeypatch.undo()      # the picks among torch's kernels only
        monkeypatch.setattr(kernel_candidates, "_native_candidates", lambda *args: [])
        for name, keep_half in (("half", True), ("fp32", False)):
            model = load_model(half_llama_dir)
            select_kernels(model, QuantMode.NONE)
            if not keep_half:
                monkeypatch.setattr("turboinfer.llm.backends.cpu.native_decode.half_storage",
                                    lambda weight: None)
            decoder = NativeDecoder.build(model, model.allocate_kv_cache(8, 4),
                                          pick_prefetch=False)
            assert decoder is not None and len(decoder.own_kernels) == 4 * len(model.layers)
            kinds = {lin.kind for layer in decoder.layers
                     for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)}
            # decode.c's kinds: 0 fp32, 5 and 6 fp32 arithmetic on fp16 / bf16 weights
            assert (kinds and kinds <= {5, 6}) if keep_half else kinds == {0}
            decoder.forward(prompt, 0, table, 1)
            rows = decoder.forward([7, 8, 9], len(prompt), table, 3)
            ones = torch.cat([decoder.forward([t], len(prompt) + i, table, 1)
                              for i, t in enumerate([7, 8, 9])])
            assert torch.equal(rows, ones)
            runs[name] = rows
        assert torch.equal(runs["half"], runs["fp32"])
    finally:
        library.set_prefetch(before, "f32")


def test_several_rows_give_the_one_row_bits_at_every_fp32_setting(
        tiny_llama_dir: Path, native_only: None) -> None:
    """A verification's rows, at each fp32 setting the build may pick, give each row's
    logits to the bit as one-row steps do: speculative decoding's greedy output is then
    plain decoding's, not merely close to it."""
    library = native_status().library
    assert library is not None
    before = library.set_prefetch(-1, "f32")
    model = _native_model(tiny_llama_dir, QuantMode.NONE)
    prompt, more = [(5 * j + 1) % 128 for j in range(7)], [9, 40, 77, 3, 12, 6, 50]
    table = [2, 0, 3, 1, 5, 4]
    try:
        for setting in prefetch.f32_settings(library):
            library.set_prefetch(setting, "f32")
            decoder = NativeDecoder.build(model, model.allocate_kv_cache(6, 4),
                                          pick_prefetch=False)
            assert decoder is not None
            decoder.forward(prompt, 0, table, 1)
            rows = decoder.forward(more, len(prompt), table, len(more))
            ones = torch.cat([decoder.forward([t], len(prompt) + i, table, 1)
                              for i, t in enumerate(more)])
            assert torch.equal(rows, ones), setting
    finally:
        library.set_prefetch(before, "f32")


def test_the_fp32_fetch_ahead_is_measured_at_build_and_changes_no_result(
        tiny_llama_dir: Path, native_only: None) -> None:
    """The fp32 kernel's way with several rows is timed at each of its settings when the
    step is built and the fastest is left in force; a verification's logits are the
    same bits at every setting of one kind of pass. An int8 model has no fp32 layer to
    time, and a draft's step is not asked to: the setting stays."""
    library = native_status().library
    assert library is not None
    before = library.set_prefetch(-1, "f32")
    try:
        model = _native_model(tiny_llama_dir, QuantMode.NONE)
        decoder = NativeDecoder.build(model, model.allocate_kv_cache(6, 4))
        assert decoder is not None and decoder.f32_prefetch is not None
        timings = decoder.f32_prefetch.step_ms["f32"]
        chosen = decoder.f32_prefetch.chosen["f32"]
        settings = prefetch.f32_settings(library)
        assert set(timings) == set(settings)
        assert timings[chosen] == min(timings.values())
        assert library.set_prefetch(-1, "f32") == chosen
        prompt, more = [(5 * j + 1) % 128 for j in range(7)], [9, 40, 77, 3, 12, 6, 50]
        logits = []
        for setting in settings:
            library.set_prefetch(setting, "f32")
            decoder.forward(prompt, 0, [2, 0, 3, 1, 5, 4], 1)
            logits.append(decoder.forward(more, len(prompt), [2, 0, 3, 1, 5, 4], len(more)))
        # The same bits at every setting of one kind of pass (256-bit tiles below
        # f32_wide_from, 512-bit passes from it); across the kinds, the same numbers.
        wide = [library.f32_wide and s >= library.f32_wide_from for s in settings]
        for kind in (False, True):
            same = [lg for w, lg in zip(wide, logits, strict=True) if w == kind]
            assert all(torch.equal(same[0], other) for other in same[1:])
        torch.testing.assert_close(logits[0], logits[-1], atol=1e-4, rtol=1e-4)
        library.set_prefetch(256, "f32")
        int8 = _native_model(tiny_llama_dir, QuantMode.INT8)
        quantized = NativeDecoder.build(int8, int8.allocate_kv_cache(6, 4))
        assert quantized is not None and quantized.f32_prefetch is None
        assert library.set_prefetch(-1, "f32") == 256
        # A draft's step (not asked to pick) leaves the setting its target's chose.
        draft = NativeDecoder.build(model, model.allocate_kv_cache(6, 4), pick_prefetch=False)
        assert draft is not None and draft.f32_prefetch is None
        assert library.set_prefetch(-1, "f32") == 256
        runner = ModelRunner(model, model.allocate_kv_cache(6, 4), pick_prefetch=False)
        runner.run([StepItem([5, 6], 0, [0, 1], 1)])
        assert runner.decode_path() == "native" and library.set_prefetch(-1, "f32") == 256
    finally:
        library.set_prefetch(before, "f32")


@pytest.fixture(scope="module")
def long_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llm_helpers import save_random_hf_model

    return save_random_hf_model(tmp_path_factory.mktemp("long_llama"), seed=3,
                                max_position_embeddings=1024, hidden_size=96,
                                num_attention_heads=6, num_key_value_heads=3)


def test_long_contexts_give_the_same_bits_on_any_thread_count_and_row_count(
        long_llama_dir: Path, native_only: None) -> None:
    """Past 128 positions the step's attention runs in chunks split across threads
    (decode.c, ATTEND_CHUNK): one and two threads give the same logits to the bit, a
    verification's rows what one-row steps give, and the logits stay those of the
    torch path."""
    from turboinfer.llm.backends.cpu.native import native_status

    lib = native_status().library
    assert lib is not None
    model = _native_model(long_llama_dir, QuantMode.NONE)
    table = list(range(40))
    prompt = [(11 * j + 5) % 128 for j in range(600)]
    by_threads = []
    before, solo = lib.set_threads(1), lib.solo
    f32_setting = lib.set_prefetch(-1, "f32")     # out of range: reads the setting
    lib.set_solo(False)     # the kernels split across the pool's threads
    try:
        for threads in (1, 2):
            assert lib.set_threads(threads) == threads
            decoder = NativeDecoder.build(model, model.allocate_kv_cache(40, 16))
            assert decoder is not None
            # One fp32 setting for both: each build measures its own, and the 256-bit
            # tiles round several rows apart from the 512-bit passes (not the threads).
            lib.set_prefetch(lib.f32_wide_from if lib.f32_wide else 0, "f32")
            decoder.forward(prompt[:300], 0, table, 1)     # positions 0-299 cached
            by_threads.append(decoder.forward(prompt[300:305], 300, table, 5))
            # rows past 128 positions, and rows on both sides of it
            for at in (305, 125):
                rows = decoder.greedy_rows(prompt[at:at + 5], at, table)
                one_at_a_time = [decoder.greedy_rows([t], at + i, table)[0]  # type: ignore[index]
                                 for i, t in enumerate(prompt[at:at + 5])]
                assert rows == one_at_a_time
    finally:
        lib.set_threads(before)
        lib.set_solo(solo)
        lib.set_prefetch(f32_setting, "f32")
    assert torch.equal(by_threads[0], by_threads[1])
    reference = load_model(long_llama_dir)
    with torch.inference_mode():
        want = reference.logits(reference(torch.tensor(prompt[:305]), torch.arange(305))[300:])
    torch.testing.assert_close(by_threads[0], want, rtol=1e-4, atol=1e-4)
