"""The benchmark model: the random ~110M-parameter Llama of ``benchmarks/llm`` (same
``transformers`` config, seed 0) saved as a Hugging Face folder, with a byte-level BPE
tokenizer of exactly its 32,000-token vocabulary trained on the standard library's source
(docstrings alone give too few merges), so every id decodes to text and llama.cpp
tokenizes it as ``tokenizers`` does.

    python benchmarks/llm_serving/build_model.py OUT_DIR
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SHAPE_110M = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                  num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=12,
                  max_position_embeddings=1024, tie_word_embeddings=True)
EOS = "<|endoftext|>"  # id 0, as in the demo model's tokenizer


def stdlib_sources() -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        if not {"test", "tests", "site-packages"} & set(path.relative_to(root).parts):
            yield path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(stdlib_sources(), trainer=trainer)
    return tok


def build(folder: Path) -> Path:
    if (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(SHAPE_110M["vocab_size"])
    if tok.get_vocab_size() != SHAPE_110M["vocab_size"]:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, not 32000")
    tok.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**SHAPE_110M, bos_token_id=None, eos_token_id=0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    return folder


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
