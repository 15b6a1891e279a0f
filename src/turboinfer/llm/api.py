"""``LLM``: load a model folder (or the shipped demo) and generate, batched or streamed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path

import torch

from turboinfer.errors import InvalidInputError, UnknownModelError
from turboinfer.llm.backends import select
from turboinfer.llm.backends.cpu.kernels import KernelChoice
from turboinfer.llm.backends.cpu.prefetch import PrefetchChoice
from turboinfer.llm.backends.cpu.threads import ThreadChoice, choose_threads
from turboinfer.llm.backends.device import resolve_device, resolve_dtype, runs_general
from turboinfer.llm.engine.llm_engine import LLMEngine
from turboinfer.llm.engine.sampling_params import SamplingParams
from turboinfer.llm.engine.sequence import Sequence
from turboinfer.llm.model.config import BACKENDS, EngineConfig, QuantMode
from turboinfer.llm.model.gguf import gguf_folder, own_quant
from turboinfer.llm.model.llama import LlamaModel
from turboinfer.llm.model.loader import load_model
from turboinfer.llm.model.quant_device import quantize_for_device
from turboinfer.llm.parallel.group import world_size
from turboinfer.llm.placement import Placement
from turboinfer.llm.tokenizer import Tokenizer

DEMO_DIR = Path(__file__).parent / "demo"


def demo_model_dir(name: str = "model") -> Path:
    """The shipped demo model (``model``) or its draft (``draft``)."""
    folder = DEMO_DIR / name
    if not (folder / "model.safetensors").is_file():
        raise UnknownModelError(f"demo {name} not found at {folder}; "
                                "train it with `python scripts/train_demo_llm.py` from a "
                                "source checkout")
    return folder


def model_folder(model: str | Path | None) -> Path:
    """The folder a model reference names: the demo for None, a ``.gguf`` file converted
    once into a cached folder (``llm/model/gguf.py``), else the folder itself."""
    if model is None:
        return demo_model_dir()
    path = Path(model)
    if path.suffix.lower() == ".gguf":
        return gguf_folder(path)
    return path


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    finish_reason: str
    num_preemptions: int
    ttft_s: float      # time to first token, from arrival
    tpot_s: float      # mean time per output token after the first

    @classmethod
    def from_sequence(cls, seq: Sequence, text: str) -> RequestOutput:
        times = seq.token_times
        ttft = (seq.first_token_time - seq.arrival) if seq.first_token_time else 0.0
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
        return cls(seq.request_id, tuple(seq.token_ids[:seq.num_prompt_tokens]),
                   tuple(seq.output_token_ids), text,
                   seq.finish_reason.value if seq.finish_reason else "", seq.num_preemptions,
                   ttft, tpot)


class LLM:
    """Generation over one model. ``model=None`` uses the shipped demo model. ``quant``
    None (and none in ``config``): float32 weights, or for a GGUF file of Q4_0/Q4_1 or
    Q8_0 blocks (or a folder converted from one) the file's own quantization, as the
    blocks are; ``"none"`` keeps float32 there too."""

    def __init__(self, model: str | Path | None = None, *, draft: str | Path | None = None,
                 ngram: int = 0, quant: str | QuantMode | None = None,
                 config: EngineConfig | None = None, device: str | None = None,
                 dtype: str | None = None, backend: str | None = None) -> None:
        folder = model_folder(model)
        base = config or EngineConfig()
        try:
            # Not given: the config's (which defaults to none; see a GGUF file's own below).
            quant_mode = QuantMode(base.quant if quant is None else quant)
        except ValueError:
            raise InvalidInputError(f"unknown quantization {quant!r}; use int8, int4, q8 "
                                    "or fp8") from None
        where = resolve_device(device or base.device)
        self.dtype = resolve_dtype(dtype or base.dtype, where)
        chosen = backend or base.backend
        if chosen not in BACKENDS:
            raise InvalidInputError(f"unknown backend {chosen!r}; use {', '.join(BACKENDS)}")
        if chosen == "graphs" and where.type != "cuda":
            raise InvalidInputError("the graphs backend needs a CUDA device (--device cuda)")
        if where.type != "cpu" and base.expert_memory_gb:
            raise InvalidInputError("offloaded experts run on the CPU; use --device cpu")
        world = world_size(base)
        if where.type == "cuda" and (where.index or 0) + world > torch.cuda.device_count():
            raise InvalidInputError(
                f"{world} parallel ranks need {world} GPUs from {where}, one each; this "
                f"machine has {torch.cuda.device_count()}")
        # The CPU's measured kernels and native steps are float32's; anything else (another
        # device, another dtype, the torch backend asked for) runs torch modules on the
        # general path.
        self.general = runs_general(where, self.dtype, chosen)
        # q8's kernel is the CPU's own, in one process.
        q8_runs = not (self.general or world > 1 or base.expert_memory_gb)
        # None asked for, of a folder converted from a GGUF file of Q4 or Q8_0 blocks: the
        # file's own quantization (q8 only where its kernel runs; int8 elsewhere).
        asked = quant is not None or base.quant is not QuantMode.NONE
        self.quant_source = "asked" if asked else "the default"
        own = None if asked else own_quant(folder)
        if own is not None:
            mode = QuantMode(own[0])
            quant_mode = QuantMode.INT8 if mode is QuantMode.Q8 and not q8_runs else mode
            self.quant_source = f"the GGUF file's {own[1]}"
        if quant_mode is QuantMode.Q8 and not q8_runs:
            raise InvalidInputError("q8 runs on the CPU's own kernels in one process (float32, "
                                    "backend auto, no parallelism or offloaded experts); use "
                                    "int8 or int4 there")
        if quant_mode is QuantMode.FP8 and not self.general:
            raise InvalidInputError("fp8 runs on the general path: a GPU (--device cuda), or "
                                    "on the CPU with --dtype bfloat16 or --backend torch")
        self.config = dataclasses.replace(
            base, quant=quant_mode, ngram_size=ngram or base.ngram_size, device=str(where),
            dtype=str(self.dtype).removeprefix("torch."),
            backend="torch" if self.general and chosen == "auto" and where.type == "cpu"
            else chosen)
        self.device = where
        # Per model loaded on the general path: layers on torch's int8/int4 kernel and on
        # the dequantizing fallback (model/quant_device.py).
        self.quant_layers: dict[str, dict[str, int]] = {}
        if draft is not None and self.config.ngram_size:
            raise InvalidInputError("choose one of a draft model and n-gram drafting")
        # Offloaded experts or several processes: the target loads its own way.
        self.placement = Placement(folder, self.config)
        # Kernels are timed at the thread count the engine will run with: a fixed
        # num_threads, or (0) the count measured fastest once the model's shape is known.
        if self.config.num_threads:
            torch.set_num_threads(self.config.num_threads)
        self.thread_choice: ThreadChoice | None = None
        self.kernel_choices: list[KernelChoice] = []
        self.prefetch_choice: PrefetchChoice | None = None
        self.model = self._load(folder, self.config.quant, self.kernel_choices,
                                pick_threads=not self.config.num_threads, role="target")
        mc = self.model.config
        self.tokenizer = Tokenizer.from_folder(folder, eos_token_ids=mc.eos_token_ids)
        draft_model = (self._load(model_folder(draft), self.config.draft_quant, [],
                                  role="draft") if draft is not None else None)
        self.engine = LLMEngine(self.model, self.config, tokenizer=self.tokenizer,
                                draft=draft_model)
        self.placement.attach(self.engine)

    def _load(self, folder: Path, quant: QuantMode, choices: list[KernelChoice], *,
              pick_threads: bool = False, role: str) -> LlamaModel:
        if self.general:
            # Loaded in the chosen dtype on the host (a bf16 checkpoint stays bf16: an 8B
            # model is not widened to 32 GB of float32 and narrowed back), then moved: the
            # device holds only that dtype.
            # A parallel group's rank 0 has its shard already, loaded the same way.
            model = (self.placement.take_model()
                     or load_model(folder, dtype=self.dtype).to(self.device))
            if pick_threads and self.device.type == "cpu":
                # The host's thread count matters as much on this path (a descheduled
                # intra-op thread stalls every op); on a GPU the host only launches.
                c = model.config
                self.thread_choice = choose_threads(c.hidden_size, 2 * c.intermediate_size)
            self.quant_layers[role] = quantize_for_device(
                model, quant, group_size=self.config.quant_group_size)
            return model
        model = self.placement.take_model() or load_model(folder)
        measured = select.measure(model, quant, group_size=self.config.quant_group_size,
                                  pick_threads=pick_threads, pick_prefetch=role == "target")
        if pick_threads:
            self.thread_choice = measured.threads
        if role == "target":
            self.prefetch_choice = measured.prefetch
        choices += measured.kernels
        return model

    def _encode(self, prompt: str | Seq[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        return [int(t) for t in prompt]

    def _text(self, seq: Sequence) -> str:
        return seq.output_text or self.tokenizer.decode(seq.output_token_ids)

    def generate(self, prompts: str | Seq[int] | Seq[str | Seq[int]],
                 params: SamplingParams | Seq[SamplingParams] | None = None, *,
                 priorities: Seq[int] | None = None) -> list[RequestOutput]:
        """Run all prompts through continuous batching; outputs in prompt order."""
        batch: list[str | Seq[int]]
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            batch = [prompts]  # type: ignore[list-item]
        else:
            batch = list(prompts)  # type: ignore[arg-type]
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(batch)
        if len(params) != len(batch):
            raise InvalidInputError(f"{len(batch)} prompts but {len(params)} sampling params")
        prios = list(priorities) if priorities is not None else [0] * len(batch)
        encoded = [self._encode(p) for p in batch]
        # Validate every prompt before queueing any: one bad prompt must not leave the
        # ones before it in the engine, to run inside some later call.
        for ids in encoded:
            self.engine.check_prompt(ids)
        seqs = [self.engine.add_request(ids, sp, priority=pr)
                for ids, sp, pr in zip(encoded, params, prios, strict=True)]
        try:
            while not all(s.is_finished for s in seqs):
                self.engine.step()
        finally:
            for seq in seqs:
                self.engine.abort(seq.request_id)  # no-op for finished ones
        return [RequestOutput.from_sequence(s, self._text(s)) for s in seqs]

    def stream(self, prompt: str | Seq[int], params: SamplingParams | None = None,
               ) -> Iterator[str]:
        """Yield text pieces as tokens are generated."""
        params = params or SamplingParams()
        seq = self.engine.add_request(self._encode(prompt), params)
        # Hold back what could be the start of a stop string until it is ruled out.
        holdback = max((len(s) for s in params.stop), default=1) - 1
        shown = ""
        try:
            while not seq.is_finished:
                self.engine.step()
                text = self._text(seq)
                text = text[:len(text) - holdback] if holdback else text
                # A token may end mid-character; wait until the text is whole.
                if text.startswith(shown) and not text.endswith("\ufffd"):
                    yield text[len(shown):]
                    shown = text
        finally:
            self.engine.abort(seq.request_id)  # the caller stopped early, or a step failed
        final = self._text(seq)
        if final.startswith(shown) and len(final) > len(shown):
            yield final[len(shown):]
