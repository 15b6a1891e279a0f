"""Helpers: tiny random Hugging Face models saved to disk, and engines over them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from turboinfer.llm.engine.llm_engine import LLMEngine
from turboinfer.llm.model.config import EngineConfig
from turboinfer.llm.model.llama import LlamaModel

TINY = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}


def save_random_hf_model(folder: Path, arch: str = "llama", seed: int = 0,
                         dtype: torch.dtype | None = None, **overrides: object) -> Path:
    """Build a randomly initialised ``transformers`` model and save it as a folder (in
    ``dtype`` where given, as a half-precision checkpoint is)."""
    import transformers

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }
    config_cls, model_cls = classes[arch]
    torch.manual_seed(seed)
    config = config_cls(**{**TINY, **overrides})
    model = model_cls(config)
    with torch.no_grad():
        # Default init is tiny (std 0.02); wider weights give peaked, tie-free logits.
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.15)
    if dtype is not None:
        model.to(dtype)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def hf_greedy(folder: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    model.eval()
    out = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens,
                         do_sample=False, pad_token_id=0)
    return [int(t) for t in out[0, len(prompt):]]


def make_engine(model: LlamaModel, **kwargs: object) -> LLMEngine:
    draft = kwargs.pop("draft", None)
    assert draft is None or isinstance(draft, LlamaModel)
    return LLMEngine(model, EngineConfig(**kwargs), draft=draft)  # type: ignore[arg-type]


def write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data))


_WORD_TEXT = ("the a of to and in is it that for on with as by this be are from or an at "
         "function value return list string file object module class method data type "
         "time name error default number set key new code line test read write call "
         "python text output input result first last one two three when if not none")
WORDS = _WORD_TEXT.split()


def save_word_tokenizer(folder: Path, vocab_size: int = 128) -> None:
    """A whitespace word-level tokenizer whose ids fit the tiny models' vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    for i in range(len(vocab), vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
