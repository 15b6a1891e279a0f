"""Prompt sets: random token prompts of an exact length, or real text from Python's stdlib.

Random prompts follow vLLM's ``random`` dataset: token ids drawn uniformly (special tokens
excluded), decoded to text, re-encoded and cut until the text is exactly ``input_len``
tokens for the tokenizer given (the server's own tokenizer gives exact lengths; another
one gives lengths near it, and the report then counts the server's ``usage``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

import turboinfer
from turboinfer.corpus import stdlib_docstrings
from turboinfer.errors import ConfigError
from turboinfer.load.openai.settings import Dataset, LoadSettings

DEMO_TOKENIZER = Path(turboinfer.__file__).parent / "llm" / "demo" / "model"
# Re-encoding decoded random ids may merge or split tokens; a few rounds settle it.
MAX_ROUNDS = 10
# Shorter docstrings say too little to be a prompt.
MIN_DOC_CHARS = 200


@dataclass(frozen=True)
class PromptRequest:
    prompt: str
    prompt_len: int  # tokens, as the local tokenizer counts them
    output_len: int


def load_tokenizer(folder: Path | None) -> Tokenizer:
    path = Path(folder or DEMO_TOKENIZER) / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"no tokenizer.json in {path.parent}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception
        raise ConfigError(f"{path}: cannot read tokenizer ({exc})") from None


def build_prompts(settings: LoadSettings, tokenizer: Tokenizer) -> list[PromptRequest]:
    if settings.dataset is Dataset.STDLIB:
        return stdlib_prompts(tokenizer, settings.num_prompts, settings.input_len,
                              settings.output_len, seed=settings.seed)
    return random_prompts(tokenizer, settings.num_prompts, settings.input_len,
                          settings.output_len, seed=settings.seed)


def random_prompts(tokenizer: Tokenizer, count: int, input_len: int, output_len: int, *,
                   seed: int) -> list[PromptRequest]:
    rng = np.random.default_rng(seed)
    allowed = np.array(_whole_tokens(tokenizer))
    out = []
    for _ in range(count):
        text, length = _exact_length(tokenizer, rng, allowed, input_len)
        out.append(PromptRequest(text, length, output_len))
    return out


def _whole_tokens(tokenizer: Tokenizer) -> list[int]:
    """Ids that decode alone to printable text: no special token, no partial UTF-8
    byte (which decodes to U+FFFD and re-encodes as several tokens)."""
    special = set(tokenizer.get_added_tokens_decoder())
    out = []
    for i in range(tokenizer.get_vocab_size()):
        text = tokenizer.decode([i])
        if i not in special and text.strip() and text.isprintable() and "\ufffd" not in text:
            out.append(i)
    return out


def _exact_length(tokenizer: Tokenizer, rng: np.random.Generator, allowed: np.ndarray,
                  input_len: int) -> tuple[str, int]:
    ids = rng.choice(allowed, size=input_len).tolist()
    text = tokenizer.decode(ids)
    for _ in range(MAX_ROUNDS):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) == input_len:
            break
        if len(ids) < input_len:
            ids += rng.choice(allowed, size=input_len - len(ids)).tolist()
        text = tokenizer.decode(ids[:input_len])
    return text, len(tokenizer.encode(text, add_special_tokens=False).ids)


def stdlib_prompts(tokenizer: Tokenizer, count: int, input_len: int, output_len: int, *,
                   seed: int) -> list[PromptRequest]:
    """Docstrings in a seeded order, each cut to at most ``input_len`` tokens."""
    docs = stdlib_docstrings(MIN_DOC_CHARS)
    if not docs:
        raise ConfigError("no standard-library docstrings found for --dataset stdlib")
    order = np.random.default_rng(seed).permutation(len(docs))
    out = []
    for i in range(count):
        doc = docs[int(order[i % len(docs)])]
        encoding = tokenizer.encode(doc, add_special_tokens=False)
        # Cut the text itself at a token boundary, so the prompt stays real prose.
        kept = min(input_len, len(encoding.ids))
        out.append(PromptRequest(doc[:encoding.offsets[kept - 1][1]], kept, output_len))
    return out
