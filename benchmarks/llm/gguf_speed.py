"""Batch-1 decode speed on a GGUF file: turboinfer against llama-cpp-python, side by side.

    python benchmarks/llm/gguf_speed.py --gguf FILE --llamacpp-python VENV/bin/python
        [--quant int4] [--threads 1 2] [--rounds 5] [--prompt-len 32] [--gen-len 128]

Both engines load the same file. llama.cpp runs it as it is (e.g. Q4_1) through
llama-cpp-python: the prompt is evaluated, then ``--gen-len`` tokens are decoded one at a
time (greedy, end-of-sequence ignored), and the decode rate is the tokens over the summed
wall time of the one-token ``Llama.eval`` calls (the argmax between them not counted).
llama.cpp's own eval timer (``llama_perf_context``) stays empty when llama-cpp-python
drives it token by token (0 ms over 1 run), so the calls are timed instead. turboinfer runs
``turboinfer llm bench FILE --quant Q --threads T --concurrency 1`` on the same prompt and
generation lengths; its decode rate is 1000 / TPOT p50. Prompts are random token ids of
the same length on both sides. Per round and thread count both engines run, the one that
goes first alternating, so each ratio is taken from two runs minutes apart at most; the
record is the median of the per-round ratios with the lowest and the highest. Writes
``--output`` (default ``gguf_speed.json``) beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from turboinfer.hardware import profile

HERE = Path(__file__).resolve().parent

LLAMA_CPP = """
import json, random, sys, time
import numpy as np
from llama_cpp import Llama
path = sys.argv[1]
threads, prompt_len, gen_len = (int(a) for a in sys.argv[2:5])
llm = Llama(model_path=path, n_ctx=prompt_len + gen_len + 8, n_threads=threads,
            n_threads_batch=threads, n_batch=max(512, prompt_len + gen_len + 8),
            verbose=False)   # scores holds n_batch rows: the prompt's last must be one
rng = random.Random(0)
prompt = [rng.randrange(1, llm.n_vocab()) for _ in range(prompt_len)]
llm.eval(prompt[:4])                       # warm-up, untimed
llm.reset()
begin = time.perf_counter()
llm.eval(prompt)
prompt_s, decode_s = time.perf_counter() - begin, 0.0
for _ in range(gen_len):
    token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    begin = time.perf_counter()
    llm.eval([token])
    decode_s += time.perf_counter() - begin
print(json.dumps({"n_eval": gen_len, "t_eval_ms": 1000 * decode_s,
                  "n_p_eval": prompt_len, "t_p_eval_ms": 1000 * prompt_s}))
"""


def llama_cpp(python: str, gguf: Path, threads: int, prompt_len: int,
              gen_len: int) -> dict[str, float]:
    done = subprocess.run([python, "-c", LLAMA_CPP, str(gguf), str(threads), str(prompt_len),
                           str(gen_len)], capture_output=True, text=True, check=True)
    perf = json.loads(done.stdout.strip().splitlines()[-1])
    return {"tokens_per_s": 1000.0 * perf["n_eval"] / perf["t_eval_ms"], **perf}


def turboinfer(gguf: Path, quant: str, threads: int, prompt_len: int,
               gen_len: int) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "turboinfer", "llm", "bench", str(gguf),
                           "--quant", quant, "--threads", str(threads), "--concurrency", "1",
                           "--prompt-len", str(prompt_len), "--gen-len", str(gen_len),
                           "--json"], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    row = report["results"][0]
    return {"tokens_per_s": 1000.0 / row["tpot_p50_ms"], "tpot_p50_ms": row["tpot_p50_ms"],
            "threads": report["threads"], "decode_path": report["decode_path"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gguf", type=Path, required=True)
    parser.add_argument("--llamacpp-python", required=True)
    parser.add_argument("--quant", default="int4", choices=("int8", "int4", "none"))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--gen-len", type=int, default=128)
    parser.add_argument("--output", type=Path, default=HERE / "gguf_speed.json")
    args = parser.parse_args()

    load_before = os.getloadavg()
    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        for threads in args.threads:
            sides = ["llama.cpp", "turboinfer"]
            if number % 2:
                sides.reverse()
            row: dict[str, Any] = {"round": number, "threads": threads, "first": sides[0]}
            for side in sides:
                if side == "llama.cpp":
                    row[side] = llama_cpp(args.llamacpp_python, args.gguf, threads,
                                          args.prompt_len, args.gen_len)
                else:
                    row[side] = turboinfer(args.gguf, args.quant, threads, args.prompt_len,
                                           args.gen_len)
            row["ratio"] = row["turboinfer"]["tokens_per_s"] / row["llama.cpp"]["tokens_per_s"]
            rounds.append(row)
            print(f"round {number} threads {threads}: turboinfer "
                  f"{row['turboinfer']['tokens_per_s']:.1f} tok/s, llama.cpp "
                  f"{row['llama.cpp']['tokens_per_s']:.1f} tok/s, {row['ratio']:.2f}x",
                  flush=True)

    summary = {}
    for threads in args.threads:
        mine = [r for r in rounds if r["threads"] == threads]
        ratios = [r["ratio"] for r in mine]
        summary[str(threads)] = {
            "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "turboinfer_tokens_per_s_median": statistics.median(
                r["turboinfer"]["tokens_per_s"] for r in mine),
            "llamacpp_tokens_per_s_median": statistics.median(
                r["llama.cpp"]["tokens_per_s"] for r in mine)}
    hw = profile(engines=False, gpus=False)
    out = {"gguf": args.gguf.name, "quant": args.quant, "prompt_len": args.prompt_len,
           "gen_len": args.gen_len, "summary": summary, "rounds": rounds,
           "machine": {"cpu": hw.cpu.model_name, "isa": sorted(hw.cpu.features),
                       "cores": os.cpu_count(), "python": platform.python_version()},
           "load_average": {"before": load_before, "after": os.getloadavg()}}
    args.output.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
