"""llama.cpp through llama-cpp-python's low-level API, greedy, all prompts decoded as one
batch of sequences (llama.cpp's ``batched`` example): ``python llamacpp_worker.py GGUF
THREADS``. The prompts are prefilled in one ``llama_decode`` call, then every step decodes
one token per sequence; the argmax is taken over the logits llama.cpp returns.
"""

from __future__ import annotations

import ctypes
import sys
import time

import llama_cpp as lc
import numpy as np
from protocol import serve

MAX_SEQS = 16
CTX_PER_SEQ = 1024


def main(path: str, threads: int) -> None:
    lc.llama_backend_init()
    mparams = lc.llama_model_default_params()
    model = lc.llama_model_load_from_file(path.encode(), mparams)
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    cparams = lc.llama_context_default_params()
    cparams.n_ctx = MAX_SEQS * CTX_PER_SEQ
    cparams.n_batch = cparams.n_ubatch = 1024
    cparams.n_seq_max = MAX_SEQS
    cparams.n_threads = cparams.n_threads_batch = threads
    cparams.no_perf = True
    ctx = lc.llama_init_from_model(model, cparams)
    batch = lc.llama_batch_init(MAX_SEQS * CTX_PER_SEQ, 0, 1)

    def decode(entries: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """entries: (token, position, sequence, wants logits); returns [outputs, vocab]."""
        batch.n_tokens = len(entries)
        for i, (tok, pos, seq, logits) in enumerate(entries):
            batch.token[i], batch.pos[i] = tok, pos
            batch.n_seq_id[i], batch.seq_id[i][0] = 1, seq
            batch.logits[i] = logits
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        n_out = sum(e[3] for e in entries)
        ptr = lc.llama_get_logits(ctx)
        return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)),
                                     shape=(n_out, n_vocab))

    def generate(prompts: list[list[int]], gen: int) -> tuple[list[list[int]], float]:
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        start = time.perf_counter()
        entries = [(t, pos, s, pos == len(p) - 1) for s, p in enumerate(prompts)
                   for pos, t in enumerate(p)]
        # Prefill in chunks of at most n_batch tokens.
        logits = []
        for i in range(0, len(entries), 1024):
            out = decode(entries[i:i + 1024])
            logits.append(out.copy())
        last = np.concatenate(logits)
        next_ids = last.argmax(axis=1).tolist()
        ttft = time.perf_counter() - start
        outs = [[t] for t in next_ids]
        for step in range(1, gen):
            step_entries = [(outs[s][-1], len(p) + step - 1, s, True)
                            for s, p in enumerate(prompts)]
            next_ids = decode(step_entries).argmax(axis=1).tolist()
            for s, t in enumerate(next_ids):
                outs[s].append(t)
        return outs, ttft

    serve(generate, {"engine": "llama.cpp", "version": lc.__version__})


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
