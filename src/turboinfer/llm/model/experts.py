"""Expert offload: a bounded cache of experts over the safetensors file, and a prefetcher.

With ``--expert-memory-gb`` only the non-expert weights are loaded up front. Each sparse
layer's experts come from one ``ExpertCache`` shared by all layers: built expert
modules holding at most the budget's bytes; the rest stay in the checkpoint,
which ``safe_open`` memory-maps (the page cache, not this process, holds them).

The cache's policy (``CachePolicy``) is LRU or layer-aware: layers run in a fixed
cycle, so the expert to drop is the one whose layer comes furthest ahead.

The prefetcher guesses layer l+1's experts before layer l's experts run: the residual
stream entering layer l's expert block, put through layer l+1's norm and router, picks
nearly the same experts as layer l+1 will (the residual changes little per layer). A
background thread loads the guessed experts while layer l and layer l+1's attention
compute, so a correct guess turns a synchronous load into a cache hit.

Counters (``CacheStats``): hits and misses of the experts a step needed, how many
loaded experts were prefetched and how many of the predicted experts were then used
(prefetch accuracy), and bytes read from the checkpoint.
"""

from __future__ import annotations

import enum
import itertools
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open
from torch import nn

from turboinfer.errors import ConfigError, ModelLoadError
from turboinfer.llm.model.config import ModelConfig, QuantMode
from turboinfer.llm.model.llama import DecoderLayer, LlamaModel, RMSNorm
from turboinfer.llm.model.loader import _weight_files, hf_to_fused
from turboinfer.llm.model.moe import ExpertMLP, Gate, SparseMoeBlock, build_model, moe_blocks, route
from turboinfer.llm.model.moe_weights import expert_key, fuse_expert
from turboinfer.llm.model.quant import quantize_model

GIB = 1 << 30
Key = tuple[int, int]  # (layer, expert)


@dataclass
class CacheStats:
    hits: int = 0                 # needed experts already resident (or being prefetched)
    misses: int = 0               # needed experts loaded synchronously
    prefetch_loads: int = 0       # experts the prefetcher loaded
    prefetch_used: int = 0        # ... that a later step needed before they were evicted
    predicted: int = 0            # (layer, expert) predictions made
    predicted_needed: int = 0     # ... that the layer then needed
    needed: int = 0               # (layer, expert) pairs needed, over all steps
    bytes_loaded: int = 0         # bytes read from the checkpoint
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    @property
    def prefetch_accuracy(self) -> float:
        """Of the experts predicted for a layer, the share that layer needed."""
        return self.predicted_needed / self.predicted if self.predicted else 0.0

    @property
    def prefetch_recall(self) -> float:
        """Of the experts a predicted layer needed, the share that were predicted."""
        return self.predicted_needed / self.needed if self.needed else 0.0

    def to_dict(self) -> dict[str, float]:
        return {**asdict(self), "hit_rate": self.hit_rate,
                "prefetch_accuracy": self.prefetch_accuracy,
                "prefetch_recall": self.prefetch_recall}


@dataclass(frozen=True)
class _Source:
    handle: Any     # a safetensors file opened with safe_open (memory-mapped)
    name: str


class CachePolicy(str, enum.Enum):
    """Which expert leaves a full cache.

    ``lru``: the least recently used. ``layer``: the one whose layer runs furthest in the
    future (layers run in a fixed cycle, so that is known), least recently used among
    equals; an expert needed later than every resident one is not cached at all. On a
    cycle of layers that does not fit, LRU evicts exactly the experts needed next and
    hits almost never; ``layer`` keeps a fixed share of the layers resident.
    """

    LRU = "lru"
    LAYER = "layer"


class ExpertCache:
    """Expert modules within ``capacity_bytes``, loading misses from the file."""

    def __init__(self, config: ModelConfig, sources: dict[Key, dict[str, _Source]],
                 capacity_bytes: int, *, dtype: torch.dtype = torch.float32,
                 quant: QuantMode = QuantMode.NONE, group_size: int = 32,
                 policy: CachePolicy = CachePolicy.LAYER) -> None:
        assert config.moe is not None
        self.policy = policy
        moe = config.moe
        sparse = [i for i in range(config.num_hidden_layers) if moe.is_sparse(i)]
        self._position = {layer: n for n, layer in enumerate(sparse)}
        self._current = 0           # position of the layer whose experts were last asked for
        self.hidden = config.hidden_size
        self.intermediate = config.moe.expert_intermediate_size
        self.sources = sources
        self.capacity = capacity_bytes
        self.dtype = dtype
        self.quant = quant
        self.group_size = group_size
        self.stats = CacheStats()
        self._entries: OrderedDict[Key, tuple[nn.Module, int]] = OrderedDict()
        self._prefetched: set[Key] = set()          # loaded ahead, not yet needed
        self._inflight: dict[Key, Future[nn.Module]] = {}
        self._lock = threading.Lock()
        self._used = 0

    @property
    def resident_bytes(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._entries)

    def _build(self, key: Key) -> tuple[nn.Module, int, int]:
        """(module, its bytes in memory, bytes read) for one expert, from the file."""
        parts = {proj: src.handle.get_tensor(src.name) for proj, src in self.sources[key].items()}
        read = sum(t.numel() * t.element_size() for t in parts.values())
        gate_up, down = fuse_expert(parts, f"layer {key[0]} expert {key[1]}")
        with torch.device("meta"):
            module = ExpertMLP(self.hidden, self.intermediate)
        module.gate_up_proj.weight = nn.Parameter(gate_up.to(self.dtype), requires_grad=False)
        module.down_proj.weight = nn.Parameter(down.to(self.dtype), requires_grad=False)
        quantize_model(module, self.quant, group_size=self.group_size)
        size = sum(t.numel() * t.element_size()
                   for t in (*module.parameters(), *module.buffers()))
        return module, size, read

    def _distance(self, key: Key) -> int:
        """Layers until ``key`` is next needed: 1 for the next layer, all of them for the
        layer running now."""
        cycle = len(self._position)
        return (self._position[key[0]] - self._current - 1) % cycle + 1

    def _victim(self) -> Key:
        if self.policy is CachePolicy.LRU:
            return next(iter(self._entries))
        # Furthest next use; max() keeps the first (least recent) among equals.
        return max(self._entries, key=self._distance)

    def _insert(self, key: Key, module: nn.Module, size: int, read: int,
                prefetched: bool) -> None:
        with self._lock:
            self.stats.bytes_loaded += read
            if key in self._entries:
                return
            while self._entries and self._used + size > self.capacity:
                old = self._victim()
                if (self.policy is CachePolicy.LAYER
                        and self._distance(old) < self._distance(key)):
                    return  # needed later than anything resident: do not cache it
                _, old_size = self._entries.pop(old)
                self._prefetched.discard(old)
                self._used -= old_size
                self.stats.evictions += 1
            if size <= self.capacity:
                self._entries[key] = (module, size)
                self._used += size
                if prefetched:
                    self._prefetched.add(key)

    def get(self, keys: list[Key]) -> dict[Key, nn.Module]:
        """The modules for ``keys``, loading the missing ones now. The caller's references
        keep a module alive even if a later insertion evicts it."""
        found: dict[Key, nn.Module] = {}
        waits: dict[Key, Future[nn.Module]] = {}
        missing: list[Key] = []
        with self._lock:
            if keys:
                self._current = self._position[keys[0][0]]
            for key in keys:
                entry = self._entries.get(key)
                if entry is not None:
                    self._entries.move_to_end(key)
                    found[key] = entry[0]
                elif key in self._inflight:
                    waits[key] = self._inflight[key]
                else:
                    missing.append(key)
                    continue
                self.stats.hits += 1
                if key in self._prefetched or key in waits:
                    self._prefetched.discard(key)
                    self.stats.prefetch_used += 1
            self.stats.misses += len(missing)
        for key, future in waits.items():
            found[key] = future.result()
        for key in missing:
            module, size, read = self._build(key)
            self._insert(key, module, size, read, prefetched=False)
            found[key] = module
        return found

    def prefetch(self, keys: list[Key], executor: ThreadPoolExecutor) -> None:
        """Start loading those of ``keys`` that are neither resident nor on their way."""
        with self._lock:
            todo = [k for k in keys if k not in self._entries and k not in self._inflight]
            for key in todo:
                self._inflight[key] = executor.submit(self._prefetch_one, key)

    def _prefetch_one(self, key: Key) -> nn.Module:
        try:
            module, size, read = self._build(key)
            self._insert(key, module, size, read, prefetched=True)
            with self._lock:
                self.stats.prefetch_loads += 1
            return module
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = CacheStats()


class Prefetcher:
    """Predicts each sparse layer's experts from the layer before and loads them early."""

    def __init__(self, cache: ExpertCache, routers: dict[int, tuple[RMSNorm, Gate]],
                 top_k: int, normalize: bool, enabled: bool = True) -> None:
        self.cache = cache
        self.routers = routers          # sparse layer -> (its post-attention norm, router)
        self.top_k = top_k
        self.normalize = normalize
        self.enabled = enabled
        layers = sorted(routers)
        self.next_layer = dict(itertools.pairwise(layers))
        self._predicted: dict[int, list[int]] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="expert-prefetch")

    def predict(self, layer: int, residual: torch.Tensor) -> None:
        """Called with the residual stream entering ``layer``'s expert block: guess the
        next sparse layer's experts (loaded once ``layer``'s own experts are in hand)."""
        nxt = self.next_layer.get(layer)
        if not self.enabled or nxt is None:
            return
        norm, gate = self.routers[nxt]
        _, ids = route(gate(norm(residual)), self.top_k, self.normalize)
        self._predicted[nxt] = torch.unique(ids).tolist()

    def launch(self, layer: int) -> None:
        """``layer``'s experts are fetched: start loading the next layer's guesses."""
        nxt = self.next_layer.get(layer)
        if nxt is not None and nxt in self._predicted:
            self.cache.prefetch([(nxt, e) for e in self._predicted[nxt]], self._executor)

    def score(self, layer: int, needed: list[int]) -> None:
        """Compare ``layer``'s prediction (if any) with the experts it needed."""
        guess = self._predicted.pop(layer, None)
        if guess is None:
            return
        stats = self.cache.stats
        stats.predicted += len(guess)
        stats.predicted_needed += len(set(guess) & set(needed))
        stats.needed += len(needed)

    def close(self) -> None:
        self._executor.shutdown(wait=True)


class OffloadedExperts(nn.Module):
    """One layer's experts, served by the shared cache (no parameters of its own)."""

    def __init__(self, layer: int, num_experts: int, cache: ExpertCache) -> None:
        super().__init__()
        self.layer = layer
        self.num_experts = num_experts
        self.cache = cache
        self.prefetcher: Prefetcher | None = None

    def holds(self, expert: int) -> bool:
        return 0 <= expert < self.num_experts

    def fetch(self, experts: list[int]) -> dict[int, nn.Module]:
        if self.prefetcher is not None:
            self.prefetcher.score(self.layer, experts)
        found = self.cache.get([(self.layer, e) for e in experts])
        if self.prefetcher is not None:
            self.prefetcher.launch(self.layer)
        return {e: found[(self.layer, e)] for e in experts}


class PredictingNorm(nn.Module):
    """A layer's post-attention norm that first hands its input, the residual stream, to
    the prefetcher (the decoder's forward stays as it is)."""

    def __init__(self, norm: RMSNorm, layer: int, prefetcher: Prefetcher) -> None:
        super().__init__()
        self.norm = norm
        self.layer = layer
        self.prefetcher = prefetcher

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.prefetcher.predict(self.layer, x)
        return self.norm(x)


def _open_sources(folder: Path, config: ModelConfig,
                  ) -> tuple[dict[Key, dict[str, _Source]], dict[str, torch.Tensor]]:
    """Index the experts' weights in the (memory-mapped) files; read everything else."""
    sources: dict[Key, dict[str, _Source]] = {}
    dense: dict[str, torch.Tensor] = {}
    for file in _weight_files(folder):
        if not file.is_file():
            raise ModelLoadError(f"{folder}: weight shard {file.name} is missing")
        try:
            handle = safe_open(str(file), framework="pt")
        except Exception as exc:  # the Rust side raises a bare Exception
            raise ModelLoadError(f"{file}: cannot read weights ({exc})") from None
        for name in handle.keys():  # noqa: SIM118 - a safetensors handle, not a dict
            key = expert_key(name)
            if key is not None:
                sources.setdefault(key[:2], {})[key[2]] = _Source(handle, name)
            else:
                dense[name] = handle.get_tensor(name)
    assert config.moe is not None
    for layer in range(config.num_hidden_layers):
        if config.moe.is_sparse(layer):
            for e in range(config.moe.num_experts):
                if (layer, e) not in sources:
                    raise ModelLoadError(f"{folder}: weights for layer {layer} expert {e} "
                                         "missing")
    return sources, dense


def load_offloaded_model(folder: Path, memory_gb: float, *, prefetch: bool = True,
                         quant: QuantMode = QuantMode.NONE, group_size: int = 32,
                         policy: CachePolicy = CachePolicy.LAYER) -> LlamaModel:
    """A MoE model whose experts stay in the checkpoint behind a ``memory_gb`` cache."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelLoadError(f"{folder}: no such model folder")
    config = ModelConfig.from_file(folder / "config.json")
    moe = config.moe
    if moe is None:
        raise ConfigError(f"{folder}: --expert-memory-gb needs a mixture-of-experts model "
                          f"({config.architecture} has no experts)")
    if memory_gb <= 0:
        raise ConfigError("--expert-memory-gb must be > 0")
    sources, dense = _open_sources(folder, config)
    cache = ExpertCache(config, sources, int(memory_gb * GIB), quant=quant,
                        group_size=group_size, policy=policy)
    sparse = [i for i in range(config.num_hidden_layers) if moe.is_sparse(i)]
    holders = {i: OffloadedExperts(i, moe.num_experts, cache) for i in sparse}
    model = build_model(config, experts_for=dict(holders))
    state = hf_to_fused(dense, config)
    expected = set(model.state_dict())
    if config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ModelLoadError(f"{folder}: weights missing {missing[:5]}, "
                             f"unexpected {unexpected[:5]}")
    model.load_state_dict(state, strict=False)
    model.eval()
    model.requires_grad_(False)
    layers = cast(list[DecoderLayer], list(model.layers))
    routers = {i: (layers[i].post_attention_layernorm,
                   cast(SparseMoeBlock, layers[i].mlp).gate) for i in sparse}
    prefetcher = Prefetcher(cache, routers, moe.top_k, moe.norm_topk_prob, enabled=prefetch)
    for i in sparse:
        holders[i].prefetcher = prefetcher
        layers[i].post_attention_layernorm = PredictingNorm(  # type: ignore[assignment]
            routers[i][0], i, prefetcher)
    return model


def expert_cache(model: nn.Module) -> ExpertCache | None:
    """The model's expert cache, if its experts are offloaded."""
    for block in moe_blocks(model):
        if isinstance(block.experts, OffloadedExperts):
            return block.experts.cache
    return None


def reset_moe_stats(model: nn.Module) -> None:
    for block in moe_blocks(model):
        block.tokens_per_expert.zero_()
    cache = expert_cache(model)
    if cache is not None:
        cache.reset_stats()


def moe_report(model: nn.Module, output_tokens: int = 0) -> dict[str, Any] | None:
    """Per-layer load balance and, when offloaded, the cache and prefetch counters.

    ``imbalance`` is the busiest expert's tokens over the mean (1.0: perfectly even).
    """
    blocks = moe_blocks(model)
    if not blocks:
        return None
    layers = []
    for block in blocks:
        counts = block.tokens_per_expert.tolist()
        mean = sum(counts) / len(counts)
        layers.append({"layer": block.layer, "tokens_per_expert": counts,
                       "imbalance": max(counts) / mean if mean else 0.0})
    report: dict[str, Any] = {"experts_per_layer": blocks[0].num_experts,
                              "top_k": blocks[0].top_k, "load_balance": layers}
    cache = expert_cache(model)
    if cache is not None:
        stats = cache.stats.to_dict()
        stats["resident_experts"] = len(cache)
        stats["resident_bytes"] = cache.resident_bytes
        stats["capacity_bytes"] = cache.capacity
        stats["bytes_loaded_per_token"] = (cache.stats.bytes_loaded / output_tokens
                                           if output_tokens else 0.0)
        report["expert_cache"] = stats
    return report
