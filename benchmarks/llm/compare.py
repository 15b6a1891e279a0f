"""Side by side on one machine, in interleaved rounds: transformers, CTranslate2 (fp32,
int8), llama.cpp (F32, Q8_0, Q4_0) and turboinfer (fp32, int8, int4) on the random 110M
Llama (hidden 768, 12 layers, GQA 12/4 heads, vocabulary 32000), greedy, one thread.

    python benchmarks/llm/compare.py [--rounds 3] [--threads 1]

Per round and engine (the engine order rotates every round): batch 1 (one prompt of 64
tokens + 64 generated), batch 16 (16 such prompts at once; turboinfer runs them through
continuous batching, CTranslate2 and llama.cpp as one batch of sequences) and time to
first token of a 512-token prompt (one generated token). Each engine lives in its own
process and, for the peers, its own venv (``workers/``); all stay loaded for the whole
run. Also recorded: greedy ids against transformers fp32, the bandwidth roofline of each
turboinfer format (read bandwidth measured every round), perplexity of each turboinfer
format on the shipped held-out text, the load average at every round.

Set-up (peers under /work/peers, never in the project's venv; see README.md):
``llm110m-gqa`` (HF folder), its GGUF files and CTranslate2 conversions. Writes
``compare.json`` here and prints the README table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS = Path("/work/peers")
MODEL = PEERS / "llm110m-gqa"
LOGS = Path("/tmp/turboinfer-llm-compare")
PROMPT_LEN, GEN_LEN, BATCH, TTFT_PROMPT = 64, 64, 16, 512


@dataclass(frozen=True)
class Engine:
    name: str
    weights: str
    python: Path
    argv: tuple[str, ...]


def engines(threads: int) -> list[Engine]:
    t = str(threads)
    project = Path(sys.executable)
    ct2 = PEERS / "ct2" / "bin" / "python"
    llama = PEERS / "llamacpp-venv" / "bin" / "python"
    w = HERE / "workers"
    out = [Engine("transformers", "fp32", project, (str(w / "hf_worker.py"), str(MODEL), t))]
    for q in ("float32", "int8"):
        out.append(Engine("CTranslate2", {"float32": "fp32"}.get(q, q), ct2,
                          (str(w / "ct2_worker.py"), f"{MODEL}-ct2-{q}", t)))
    for q in ("f32", "q8_0", "q4_0"):
        out.append(Engine("llama.cpp", q.upper(), llama,
                          (str(w / "llamacpp_worker.py"), f"{MODEL}-{q}.gguf", t)))
    for q in ("none", "int8", "int4"):
        out.append(Engine("turboinfer", {"none": "fp32"}.get(q, q), project,
                          (str(w / "turboinfer_worker.py"), str(MODEL), t, q)))
    return out


class Worker:
    """One engine's worker process (``workers/``), speaking ``workers/protocol.py``."""

    def __init__(self, key: str, python: Path, argv: list[str] | tuple[str, ...],
                 env: dict[str, str]) -> None:
        self.key = key
        LOGS.mkdir(parents=True, exist_ok=True)
        log = LOGS / f"{key.replace(' ', '-')}.log"
        with log.open("w") as err:  # llama.cpp logs every tensor it loads
            self.proc = subprocess.Popen([str(python), *argv], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, text=True,
                                         env={**os.environ, **env})
        self.info = self._read()

    @classmethod
    def for_engine(cls, engine: Engine) -> Worker:
        return cls(f"{engine.name} {engine.weights}", engine.python, engine.argv,
                   {"OMP_NUM_THREADS": engine.argv[2]})

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.key}: worker exited ({self.proc.wait()})")
        return dict(json.loads(line))

    def generate(self, prompts: list[list[int]], gen: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "generate", "prompts": prompts, "gen": gen})
                              + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write('{"op": "quit"}\n')
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)


def make_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, 32000) for _ in range(length)] for _ in range(n)]


def matching_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def perplexities(threads: int) -> dict[str, dict[str, float]]:
    """Each turboinfer format's perplexity, through the kernels the engine would choose,
    on the shipped held-out text: the demo model (trained) and the 110M model (random)."""
    import torch

    from turboinfer.llm import demo_model_dir
    from turboinfer.llm.backends.cpu.kernels import select_kernels
    from turboinfer.llm.model.config import QuantMode
    from turboinfer.llm.model.loader import load_model
    from turboinfer.llm.perplexity import perplexity
    from turboinfer.llm.tokenizer import Tokenizer

    torch.set_num_threads(threads)
    text = (demo_model_dir().parent / "heldout.txt").read_text()
    out: dict[str, dict[str, float]] = {}
    for name, folder, n_tokens in (("demo", demo_model_dir(), 8192), ("110m", MODEL, 2048)):
        tokens = Tokenizer.from_folder(folder).encode(text)[:n_tokens]
        res: dict[str, float] = {}
        for mode in QuantMode:
            model = load_model(folder)
            select_kernels(model, mode)
            res[mode.value] = perplexity(model, tokens, window=256)
        out[name] = res
    return out


def summarize(rounds: list[dict[str, Any]], infos: dict[str, dict[str, Any]],
              reference: dict[str, list[list[int]]]) -> dict[str, Any]:
    keys = list(rounds[0]["runs"])
    summary: dict[str, Any] = {}
    for key in keys:
        runs = [r["runs"][key] for r in rounds]
        b1 = [x["b1"] for x in runs]
        b16 = [x["b16"] for x in runs]
        ttft = [x["ttft"] for x in runs]
        row: dict[str, Any] = {
            "b1_tps": statistics.median(GEN_LEN / x["wall_s"] for x in b1),
            "b1_tps_cpu": statistics.median(GEN_LEN / x["cpu_s"] for x in b1),
            "b16_tps": statistics.median(BATCH * GEN_LEN / x["wall_s"] for x in b16),
            "b16_tps_cpu": statistics.median(BATCH * GEN_LEN / x["cpu_s"] for x in b16),
            "ttft512_ms": statistics.median(1e3 * x["wall_s"] for x in ttft),
            "b1_ids_match_hf": matching_prefix(b1[-1]["ids"][0], reference["b1"][0]),
            "b16_ids_match_hf": sum(matching_prefix(a, b) for a, b in
                                    zip(b16[-1]["ids"], reference["b16"], strict=True)),
        }
        if b1[0]["ttft_s"] is not None:
            row["b1_decode_tps"] = statistics.median(
                (GEN_LEN - 1) / (x["wall_s"] - x["ttft_s"]) for x in b1)
        info = infos[key]
        if "bytes_per_token" in info:
            fractions = []
            for r in rounds:
                x = r["runs"][key]["b1"]
                decode = (GEN_LEN - 1) / (x["wall_s"] - x["ttft_s"])
                fractions.append(decode * info["bytes_per_token"] / r["bandwidth"])
            row["bytes_per_token"] = info["bytes_per_token"]
            row["roofline_tps"] = statistics.median(r["bandwidth"] for r in rounds) / \
                info["bytes_per_token"]
            row["roofline_fraction"] = statistics.median(fractions)
        if "decode_path" in info:
            row["decode_path"] = info["decode_path"]
        summary[key] = row
    return summary


def ratio(rounds: list[dict[str, Any]], num: str, den: str, metric: str,
          inverse: bool = False) -> dict[str, float]:
    """The per-round speed ratio of ``num`` over ``den`` (den's wall time over num's, so
    > 1 means num is faster, for throughput and TTFT alike); median, min, max."""
    vals = []
    for r in rounds:
        a, b = r["runs"][num][metric], r["runs"][den][metric]
        vals.append(a["wall_s"] / b["wall_s"] if inverse else b["wall_s"] / a["wall_s"])
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--only", default="", help="comma-separated engine keys to run")
    parser.add_argument("--tables", action="store_true", help="print the table and exit")
    args = parser.parse_args()
    out_path = HERE / "compare.json"
    if args.tables:
        print(markdown(json.loads(out_path.read_text())))
        return
    sys.path.insert(0, str(HERE.parents[1] / "src"))
    from turboinfer.llm.bench import measure_read_bandwidth

    chosen = [e for e in engines(args.threads)
              if not args.only or f"{e.name} {e.weights}" in args.only.split(",")]
    started = time.time()
    load_start = os.getloadavg()
    workers = [Worker.for_engine(e) for e in chosen]
    infos = {w.key: w.info for w in workers}
    for w in workers:   # warm-up: first calls pay one-off allocations
        w.generate(make_prompts(2, 16, 0), 4)
    rounds: list[dict[str, Any]] = []
    for i in range(args.rounds):
        order = workers[i % len(workers):] + workers[:i % len(workers)]
        # New prompts every round: a prefix cache must not turn later rounds' prefills
        # into hits.
        b1_prompts = make_prompts(1, PROMPT_LEN, 100 * i + 1)
        b16_prompts = make_prompts(BATCH, PROMPT_LEN, 100 * i + 16)
        ttft_prompt = make_prompts(1, TTFT_PROMPT, 100 * i + 512)
        rnd: dict[str, Any] = {"load_average": os.getloadavg(),
                               "bandwidth": measure_read_bandwidth(args.threads)["bandwidth"],
                               "runs": {}}
        for w in order:
            rnd["runs"][w.key] = {"b1": w.generate(b1_prompts, GEN_LEN),
                                  "b16": w.generate(b16_prompts, GEN_LEN),
                                  "ttft": w.generate(ttft_prompt, 1)}
            print(f"round {i + 1}: {w.key} b1 {GEN_LEN / rnd['runs'][w.key]['b1']['wall_s']:.1f}"
                  f" tok/s, b16 {BATCH * GEN_LEN / rnd['runs'][w.key]['b16']['wall_s']:.1f}",
                  file=sys.stderr, flush=True)
        rounds.append(rnd)
    for w in workers:
        w.close()
    ref_key = "transformers fp32"
    reference = ({"b1": rounds[-1]["runs"][ref_key]["b1"]["ids"],
                  "b16": rounds[-1]["runs"][ref_key]["b16"]["ids"]}
                 if ref_key in rounds[-1]["runs"] else
                 {"b1": [[]], "b16": [[] for _ in range(BATCH)]})
    summary = summarize(rounds, infos, reference)
    ti, ct, lc = "turboinfer", "CTranslate2", "llama.cpp"
    # TTFT: CTranslate2's time over turboinfer's, so > 1 means turboinfer is faster.
    pairs = [(f"{ti} fp32", f"{ct} fp32", "b1"), (f"{ti} int8", f"{lc} Q8_0", "b1"),
             (f"{ti} int4", f"{lc} Q4_0", "b1"), (f"{ti} fp32", f"{lc} F32", "b1"),
             (f"{ti} fp32", f"{ct} fp32", "b16"), (f"{ti} int8", f"{ct} int8", "b16"),
             (f"{ti} int4", f"{ct} int8", "b16"), (f"{ti} fp32", f"{ct} fp32", "ttft"),
             (f"{ti} int8", f"{ct} int8", "ttft")]
    ratios = {f"{a} / {b} ({m})": ratio(rounds, a, b, m) for a, b, m in pairs
              if a in summary and b in summary}
    results = {
        "machine": {"cpu": cpu_model(), "logical_cores": os.cpu_count(),
                    "python": platform.python_version(), "threads": args.threads,
                    "load_average_at_start": load_start, "load_average_at_end": os.getloadavg(),
                    "seconds": time.time() - started},
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "settings": {"prompt_len": PROMPT_LEN, "gen_len": GEN_LEN, "batch": BATCH,
                     "ttft_prompt_len": TTFT_PROMPT, "rounds": args.rounds},
        "engines": infos,
        "summary": summary,
        "ratios": ratios,
        "perplexity": perplexities(args.threads),
        "rounds": [{**r, "runs": {k: {m: {f: v for f, v in x.items() if f != "ids"}
                                      for m, x in runs.items()}
                                  for k, runs in r["runs"].items()}} for r in rounds],
    }
    out_path.write_text(json.dumps(results, indent=1) + "\n")
    print(markdown(results))


def cpu_model() -> str:
    from turboinfer.hardware.cpu import read_cpu  # after main() put this checkout's src first

    return read_cpu().model_name


def targets(results: dict[str, Any]) -> list[str]:
    """The issue's targets, each with the figure that decides it."""
    sm, rt = results["summary"], results["ratios"]
    ppl = results.get("perplexity", {}).get("demo", {})

    def r(name: str) -> str:
        x = rt.get(name)
        return f"{x['median']:.2f}x ({x['min']:.2f}-{x['max']:.2f}x)" if x else "–"

    def ok(cond: bool) -> str:
        return "yes" if cond else "no"

    fp32, int8 = sm.get("turboinfer fp32", {}), sm.get("turboinfer int8", {})
    # The quantized format with the higher batch-16 throughput.
    best16 = max(("int8", "int4"), key=lambda w: sm[f"turboinfer {w}"]["b16_tps"])
    b16_name = f"turboinfer {best16} / CTranslate2 int8 (b16)"
    ppl_inc = 100 * (ppl[best16] / ppl["none"] - 1) if ppl else float("nan")

    def med(name: str) -> float:
        return float(rt[name]["median"]) if name in rt else 0.0

    rows = [
        ("fp32 batch 1 >= 80% of the bandwidth roofline",
         f"{100 * fp32.get('roofline_fraction', 0):.0f}%",
         ok(fp32.get("roofline_fraction", 0) >= 0.8)),
        ("fp32 batch 1 ahead of CTranslate2 fp32", r("turboinfer fp32 / CTranslate2 fp32 (b1)"),
         ok(med("turboinfer fp32 / CTranslate2 fp32 (b1)") > 1)),
        ("int8 batch 1 >= 60% of its roofline", f"{100 * int8.get('roofline_fraction', 0):.0f}%",
         ok(int8.get("roofline_fraction", 0) >= 0.6)),
        ("int8 batch 1 ahead of llama.cpp Q8_0", r("turboinfer int8 / llama.cpp Q8_0 (b1)"),
         ok(med("turboinfer int8 / llama.cpp Q8_0 (b1)") > 1)),
        ("int4 batch 1 ahead of llama.cpp Q4_0", r("turboinfer int4 / llama.cpp Q4_0 (b1)"),
         ok(med("turboinfer int4 / llama.cpp Q4_0 (b1)") > 1)),
        (f"batch 16 >= 2x CTranslate2 int8 (best format: {best16}), perplexity within +1%",
         f"{r(b16_name)}, perplexity {ppl_inc:+.2f}%",
         ok(med(b16_name) >= 2 and ppl_inc <= 1)),
        ("fp32 batch 16 ahead of CTranslate2 fp32", r("turboinfer fp32 / CTranslate2 fp32 (b16)"),
         ok(med("turboinfer fp32 / CTranslate2 fp32 (b16)") > 1)),
        ("TTFT(512) <= CTranslate2's (fp32 against fp32)",
         r("turboinfer fp32 / CTranslate2 fp32 (ttft)"),
         ok(med("turboinfer fp32 / CTranslate2 fp32 (ttft)") >= 1)),
        ("greedy ids = transformers in fp32",
         f"{fp32.get('b1_ids_match_hf')}/{GEN_LEN}, {fp32.get('b16_ids_match_hf')}/"
         f"{BATCH * GEN_LEN}",
         ok(fp32.get("b1_ids_match_hf") == GEN_LEN
            and fp32.get("b16_ids_match_hf") == BATCH * GEN_LEN)),
    ]
    return ["| target (issue #17) | this run (ratio: median over rounds, min-max) | met |",
            "|---|---|---|", *(f"| {a} | {b} | {c} |" for a, b, c in rows)]


def markdown(results: dict[str, Any]) -> str:
    lines = ["| engine | weights | batch 1 tok/s | batch 1 tok/CPU-s | batch 16 tok/s | "
             "batch 16 tok/CPU-s | TTFT 512 (ms) | greedy ids = transformers (b1 / b16) | "
             "roofline fraction (b1 decode) |", "|---|---|---|---|---|---|---|---|---|"]
    for key, r in results["summary"].items():
        name, weights = key.rsplit(" ", 1)
        roof = (f"{100 * r['roofline_fraction']:.0f}% of {r['roofline_tps']:.0f}"
                if "roofline_fraction" in r else "–")
        lines.append(f"| {name} | {weights} | {r['b1_tps']:.1f} | {r['b1_tps_cpu']:.1f} | "
                     f"{r['b16_tps']:.1f} | {r['b16_tps_cpu']:.1f} | {r['ttft512_ms']:.0f} | "
                     f"{r['b1_ids_match_hf']}/{GEN_LEN} / {r['b16_ids_match_hf']}/"
                     f"{BATCH * GEN_LEN} | {roof} |")
    lines += ["", "| ratio (per round, wall clock) | median | min | max |", "|---|---|---|---|"]
    for name, r in results["ratios"].items():
        lines.append(f"| {name} | {r['median']:.2f}x | {r['min']:.2f}x | {r['max']:.2f}x |")
    lines += ["", *targets(results)]
    ppl = results.get("perplexity", {})
    if ppl:
        lines += ["", "| model | fp32 perplexity | int8 | int4 |", "|---|---|---|---|"]
        for model, r in ppl.items():
            base = r["none"]
            lines.append(f"| {model} | {base:.2f} | {r['int8']:.2f} "
                         f"({100 * (r['int8'] / base - 1):+.2f}%) | {r['int4']:.2f} "
                         f"({100 * (r['int4'] / base - 1):+.2f}%) |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
