"""transformers ``generate()``, fp32, greedy: ``python hf_worker.py MODEL_DIR THREADS``."""

from __future__ import annotations

import sys

import torch
import transformers
from protocol import serve


def main(folder: str, threads: int) -> None:
    torch.set_num_threads(threads)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    @torch.inference_mode()
    def generate(prompts: list[list[int]], gen: int) -> tuple[list[list[int]], None]:
        ids = torch.tensor(prompts)  # equal lengths: no padding
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=gen,
                             min_new_tokens=gen, do_sample=False, pad_token_id=0)
        return out[:, ids.shape[1]:].tolist(), None

    serve(generate, {"engine": "transformers", "version": transformers.__version__})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
