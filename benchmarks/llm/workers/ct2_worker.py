"""CTranslate2 ``Generator``, greedy: ``python ct2_worker.py CT2_DIR THREADS``.

Prompts arrive as ids; CTranslate2 takes token strings, mapped through the converted
model's ``vocabulary.json`` (the same vocabulary, in id order).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ctranslate2
from protocol import serve


def main(folder: str, threads: int) -> None:
    vocab = json.loads((Path(folder) / "vocabulary.json").read_text())
    gen_model = ctranslate2.Generator(folder, device="cpu", intra_threads=threads,
                                      inter_threads=1)

    def generate(prompts: list[list[int]], gen: int) -> tuple[list[list[int]], None]:
        tokens = [[vocab[t] for t in p] for p in prompts]
        res = gen_model.generate_batch(tokens, max_length=gen, min_length=gen,
                                       sampling_topk=1, include_prompt_in_result=False,
                                       max_batch_size=len(prompts))
        return [list(r.sequences_ids[0]) for r in res], None

    serve(generate, {"engine": "ctranslate2", "version": ctranslate2.__version__})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
