"""Train the demo model and its draft on the Python standard library's docstrings.

Deterministic (fixed seeds, sorted files, fixed step counts, one thread): about 12
minutes for the model and 3 for the draft on one core of the recording machine.
Writes Hugging Face-format folders (fp16 weights, tokenizer.json) to
``src/turboinfer/llm/demo/{model,draft}`` plus ``heldout.txt``, the text the
perplexity checks use. Needs ``transformers`` (a development dependency).

    python scripts/train_demo_llm.py [--steps-target 1200] [--steps-draft 1200]
"""

from __future__ import annotations

import argparse
import ast
import math
import sysconfig
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from turboinfer.llm.config import ModelConfig
from turboinfer.llm.loader import hf_config_dict, save_model
from turboinfer.llm.model import LlamaModel

OUT = Path(__file__).resolve().parents[1] / "src" / "turboinfer" / "llm" / "demo"
EOS = "<|endoftext|>"
VOCAB = 2048
SEQ = 128

TARGET = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=6,
              num_attention_heads=8, num_key_value_heads=4, head_dim=32)
DRAFT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=1,
             num_attention_heads=4, num_key_value_heads=2, head_dim=32)


def docstrings() -> list[str]:
    """Every docstring of 100+ characters in the standard library, in file order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "site-packages", "idlelib", "lib2to3"}
    docs = []
    for path in sorted(root.rglob("*.py")):
        if skip & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef |
                          ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 100:
                    docs.append(doc.strip())
    return docs


def train_tokenizer(texts: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def hf_model(shape: dict[str, int]) -> torch.nn.Module:
    import transformers

    config = ModelConfig(vocab_size=VOCAB, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_ids=(0,), **shape)
    data = hf_config_dict(config)
    data.pop("architectures")
    data.pop("model_type")
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**data))


def train(shape: dict[str, int], tokens: torch.Tensor, steps: int, seed: int,
          batch: int = 16, lr: float = 3e-3) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = hf_model(shape)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - SEQ - 1, (10**6,), generator=gen)
    begin = time.perf_counter()
    for step in range(steps):
        if step == 5:
            per_step = (time.perf_counter() - begin) / 5
            print(f"  {per_step:.2f} s/step, about {per_step * steps / 60:.0f} min", flush=True)
        idx = starts[step * batch:(step + 1) * batch]
        x = torch.stack([tokens[i:i + SEQ + 1] for i in idx.tolist()])
        # Linear warmup over 30 steps, cosine decay; the first 5 steps hold the peak.
        frac = 0.0 if step < 5 else step / steps
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / 30) * 0.5 * (1 + math.cos(math.pi * frac))
        # The model shifts labels by one itself; inputs double as labels (the HF idiom).
        loss = model(input_ids=x[:, :-1], labels=x[:, :-1].clone()).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            print(f"  step {step} loss {loss.item():.3f}", flush=True)
    return model.eval()


def export(hf: torch.nn.Module, shape: dict[str, int], tok: Tokenizer, folder: Path) -> None:
    from turboinfer.llm.loader import hf_to_fused

    config = ModelConfig(vocab_size=VOCAB, max_position_embeddings=512,
                         tie_word_embeddings=True, eos_token_ids=(0,), **shape)
    model = LlamaModel(config)
    model.load_state_dict(hf_to_fused(dict(hf.state_dict()), config), strict=False)
    save_model(model, folder)
    tok.save(str(folder / "tokenizer.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps-target", type=int, default=1200)
    parser.add_argument("--steps-draft", type=int, default=1200)
    args = parser.parse_args()
    # One thread: with two, a loaded machine made each step 10x slower (every op waits
    # for a descheduled worker); one thread is also what makes the run reproducible.
    torch.set_num_threads(1)
    docs = docstrings()
    split = int(len(docs) * 0.95)
    train_docs, heldout = docs[:split], docs[split:]
    print(f"{len(docs)} docstrings, {sum(map(len, docs)) / 1e6:.2f} MB")
    tok = train_tokenizer(train_docs)
    ids: list[int] = []
    for enc in tok.encode_batch(train_docs):
        ids.extend([*enc.ids, 0])
    tokens = torch.tensor(ids, dtype=torch.long)
    print(f"{len(tokens)} training tokens")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "heldout.txt").write_text(f"\n\n{EOS}\n\n".join(heldout[:60]) + "\n")
    for name, shape, steps, seed in (("model", TARGET, args.steps_target, 0),
                                      ("draft", DRAFT, args.steps_draft, 1)):
        print(f"training {name}")
        export(train(shape, tokens, steps, seed), shape, tok, OUT / name)


if __name__ == "__main__":
    main()
