"""Settings: the model's shape (read from ``config.json``) and the engine's knobs.

Both are frozen dataclasses validated once at construction, then passed whole.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from turboinfer.errors import ConfigError, ModelLoadError
from turboinfer.llm.model.moe_config import MoEConfig, moe_from_hf

# The three Hugging Face layouts this decoder reproduces. They differ only in whether
# q/k/v projections carry a bias (Qwen2) and in default rope/window settings.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    # Mixture-of-experts variants (llm/model/moe.py): the same attention, an expert block
    # in place of the MLP.
    "MixtralForCausalLM": "mixtral",
    "Qwen2MoeForCausalLM": "qwen2_moe",
}


@dataclass(frozen=True)
class ModelConfig:
    """The decoder's shape. Field names follow Hugging Face's ``config.json``."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    architecture: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    moe: MoEConfig | None = None

    def __post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "head_dim", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model config: {name} must be >= 1")

    @classmethod
    def from_hf_dict(cls, data: dict[str, Any], source: str = "config.json") -> ModelConfig:
        archs = data.get("architectures") or []
        arch = next((SUPPORTED_ARCHITECTURES[a] for a in archs if a in SUPPORTED_ARCHITECTURES),
                    None)
        if arch is None:
            raise ModelLoadError(
                f"{source}: unsupported architecture {archs or data.get('model_type')!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if data.get("rope_scaling") or (data.get("rope_parameters") or {}).get(
                "rope_type", "default") != "default":
            raise ModelLoadError(f"{source}: rope_scaling is not supported")
        try:
            heads = int(data["num_attention_heads"])
            hidden = int(data["hidden_size"])
            eos = data.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
            return cls(
                vocab_size=int(data["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(data["intermediate_size"]),
                num_hidden_layers=int(data["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(data.get("num_key_value_heads") or heads),
                head_dim=int(data.get("head_dim") or hidden // heads),
                max_position_embeddings=int(data.get("max_position_embeddings", 2048)),
                rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
                # transformers 5 writes rope_theta inside rope_parameters.
                rope_theta=float(data.get("rope_theta")
                                 or (data.get("rope_parameters") or {}).get("rope_theta")
                                 or 10000.0),
                tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
                # Qwen2 always has q/k/v biases; Llama exposes it as a flag.
                attention_bias=(arch == "qwen2" or bool(data.get("attention_bias", False))
                                or (arch == "qwen2_moe" and bool(data.get("qkv_bias", True)))),
                architecture=arch,
                bos_token_id=data.get("bos_token_id"),
                eos_token_ids=tuple(int(e) for e in eos_ids),
                moe=moe_from_hf(data, arch),
            )
        except KeyError as exc:
            raise ModelLoadError(f"{source}: missing key {exc.args[0]!r}") from None

    @classmethod
    def from_file(cls, path: Path) -> ModelConfig:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise ModelLoadError(f"{path.parent}: no config.json") from None
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{path}: not valid JSON ({exc.msg})") from None
        return cls.from_hf_dict(data, source=str(path))


class QuantMode(str, enum.Enum):
    NONE = "none"
    INT8 = "int8"      # per output channel
    INT4 = "int4"      # asymmetric groups (quant_group_size), the LM head int8
    Q8 = "q8"          # int8 per group of 32 with an fp16 scale (llama.cpp's Q8_0); CPU
    FP8 = "fp8"        # float8 e4m3 per output channel, activations per row; general path


# What runs the steps (llm/backends/select.py): ``auto`` chooses by measurement (the CPU's
# native and lean paths, CUDA graphs on a GPU); ``torch`` runs every step on the general
# packed path over plain torch modules, on any device; ``graphs`` forces CUDA graphs.
BACKENDS = ("auto", "torch", "graphs")

# The KV cache on the CPU when neither num_blocks nor kv_cache_tokens is given.
CPU_KV_CACHE_TOKENS = 16384


@dataclass(frozen=True)
class EngineConfig:
    """Engine knobs. ``num_blocks=0`` sizes the KV cache from ``kv_cache_tokens``; both 0:
    the memory plan sizes it (``engine/memory_plan.py``: 16384 tokens on the CPU, the
    free device memory after the weights on CUDA)."""

    block_size: int = 16
    kv_cache_tokens: int = 0
    num_blocks: int = 0
    max_num_seqs: int = 64
    # Tokens one step may process (prefill chunks + decodes). Long prompts are split into
    # chunks of at most this size so running sequences keep decoding between chunks.
    max_num_batched_tokens: int = 512
    enable_prefix_caching: bool = True
    quant: QuantMode = QuantMode.NONE
    quant_group_size: int = 32
    # The most tokens a round proposes; best measured for the demo model and draft on
    # an AMD Zen 3 (k=4..8 back to back, 1 thread; see benchmarks/llm/README.md).
    num_speculative_tokens: int = 6
    # A lone greedy sequence's rounds propose the k (up to the above; 0, a plain step)
    # with the most expected tokens per second: round costs measured when the engine is
    # built, agreement counted as it runs (engine/spec_length.py); prompt lookup's
    # proposals are cut to it. Off: a draft proposes num_speculative_tokens every round.
    adapt_speculative_tokens: bool = True
    # Speculate only while at most this many sequences decode in a step. With more, the
    # step is busy enough that drafting costs more than verification saves (the gain
    # shrinks as the batch grows and is gone by 16 sequences on the demo model and
    # draft); above it the engine decodes plainly and the draft catches up when the
    # batch shrinks.
    speculative_max_batch: int = 8
    # A lone greedy sequence, with no other request running or waiting, runs about this
    # many milliseconds of plain decode steps in one native call (as a draft proposes),
    # and of speculative rounds per engine step: the engine's work between steps comes
    # once per burst. The demo model, bursts on against off: 1.09-1.16x at two threads,
    # 0.99-1.08x at one (benchmarks/llm/README.md, "Speculative rounds on a Zen 4").
    # New requests wait at most one burst. 0: one step per engine step.
    decode_burst_ms: float = 2.0
    # The draft's weights. Its proposals only need to agree with the target, which
    # verifies every token, so quantization costs no exactness and cuts the draft's step
    # time; its weights stay in cache, the fp32 draft's do not. int8 over int4 on the
    # native kernels: a 6-token proposal of the demo draft took 0.32 against 0.37 ms, and
    # the int8 draft agrees with the target longer (k=6: 5.11 against 4.61 tokens per
    # verification on the demo prompts, 5.17 against 4.85 on 40 held-out docstring
    # openings, 4.46 against 4.15 on the repetitive workload).
    draft_quant: QuantMode = QuantMode.INT8
    ngram_size: int = 0
    max_model_len: int = 0
    num_threads: int = 0
    # Mixture-of-experts models: 0 keeps every expert resident; more bounds the experts
    # in memory (GiB) and loads the rest from the checkpoint on demand (llm/model/experts.py).
    expert_memory_gb: float = 0.0
    expert_prefetch: bool = True
    # Which expert a full cache drops: "layer" (the one needed furthest ahead in the
    # cycle of layers) or "lru". See llm/model/experts.py.
    expert_cache_policy: str = "layer"
    # Worker processes one model runs across (llm/parallel/): attention heads and MLP
    # channels split over tensor_parallel ranks, experts over expert_parallel ranks.
    tensor_parallel: int = 1
    expert_parallel: int = 1
    # Where the weights and the KV cache live (llm/backends/device.py): cpu, cuda[:N] or
    # auto; the weights' dtype (auto: float32 on the CPU, bfloat16 on CUDA).
    device: str = "cpu"
    dtype: str = "auto"
    backend: str = "auto"
    # On CUDA: the share of the device memory free after loading the weights that the
    # KV cache and the step's activations may take (the rest stays for other users).
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError("gpu_memory_utilization must be in (0, 1]")
        if self.expert_memory_gb < 0:
            raise ConfigError("expert_memory_gb must be >= 0")
        if self.expert_cache_policy not in ("layer", "lru"):
            raise ConfigError("expert_cache_policy must be 'layer' or 'lru'")
        if self.tensor_parallel < 1 or self.expert_parallel < 1:
            raise ConfigError("tensor_parallel and expert_parallel must be >= 1")
        if self.block_size < 1:
            raise ConfigError("block_size must be >= 1")
        if self.max_num_seqs < 1:
            raise ConfigError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ConfigError("max_num_batched_tokens must be >= 1")
        if self.num_blocks < 0 or self.kv_cache_tokens < 0:
            raise ConfigError("KV cache size must be >= 0")
        if self.total_blocks < 1:
            raise ConfigError("the KV cache must hold at least one block")
        if self.quant_group_size not in (32, 64, 128, 256):
            raise ConfigError("quant_group_size must be 32, 64, 128 or 256")
        if self.num_speculative_tokens < 1:
            raise ConfigError("num_speculative_tokens must be >= 1")
        if self.speculative_max_batch < 1:
            raise ConfigError("speculative_max_batch must be >= 1")
        if self.ngram_size < 0:
            raise ConfigError("ngram_size must be >= 0")

    @property
    def total_blocks(self) -> int:
        """Blocks asked for, or the CPU's default (the memory plan may size a GPU's cache
        from free memory instead: ``engine/memory_plan.py``)."""
        if self.num_blocks:
            return self.num_blocks
        return -(-(self.kv_cache_tokens or CPU_KV_CACHE_TOKENS) // self.block_size)

    @property
    def kv_cache_sized(self) -> bool:
        """Whether the KV cache's size was given (blocks or tokens), not left to the plan."""
        return bool(self.num_blocks or self.kv_cache_tokens)
