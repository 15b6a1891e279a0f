"""turboinfer, greedy, all prompts submitted at once (continuous batching):
``python turboinfer_worker.py MODEL_DIR THREADS QUANT``. Also reports the kernels chosen
at load, the bytes of weights one batch-1 decode step reads and how that step runs."""

from __future__ import annotations

import sys

from protocol import serve

from turboinfer.llm import LLM, EngineConfig, SamplingParams
from turboinfer.llm.backends.cpu.kernels import read_bytes_per_token


def main(folder: str, threads: int, quant: str) -> None:
    llm = LLM(folder, quant=quant, config=EngineConfig(num_threads=threads,
                                                       kv_cache_tokens=16 * 1024))

    def generate(prompts: list[list[int]], gen: int) -> tuple[list[list[int]], float]:
        params = SamplingParams(max_tokens=gen, temperature=0, ignore_eos=True)
        outs = llm.generate(prompts, params)
        return [list(o.token_ids) for o in outs], outs[0].ttft_s

    serve(generate, {"engine": "turboinfer", "quant": quant,
                     "bytes_per_token": read_bytes_per_token(llm.model),
                     "kernels": [c.to_dict() for c in llm.kernel_choices],
                     "decode_path": llm.engine.runner.decode_path()})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
