"""Time to first token and fp32 decode, turboinfer against CTranslate2 fp32, side by side.

    python benchmarks/llm/prefill_probe.py [--rounds 5] [--baseline REV]

The random 110M Llama of ``compare.py`` (``setup_peers.py`` makes it), one thread, greedy.
Per round, in a rotating order, each engine (its own process, the workers of
``compare.py``) runs: the time to first token of a 512-token prompt, batch 1 (64-token
prompt, 64 generated) and batch 16 (16 such prompts at once). New prompts every round,
so turboinfer's prefix cache never turns a prefill into a hit. turboinfer runs from this
checkout's ``src`` (``--revision REV``: from git revision ``REV``). ``--baseline REV`` adds
turboinfer as of git revision ``REV`` (extracted to a temporary folder and put first on
its worker's ``PYTHONPATH``), so a change is measured against its predecessor in the same
rounds. Writes ``prefill_probe.json`` here: every run, per-round ratios (CTranslate2's
wall time over turboinfer's, > 1 means turboinfer is faster), the load average at each
round, the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

from compare import (
    BATCH,
    GEN_LEN,
    HERE,
    MODEL,
    PEERS,
    PROMPT_LEN,
    Worker,
    cpu_model,
    make_prompts,
)

REPO = HERE.parents[1]
TTFT_PROMPT = 512


def extract_revision(rev: str, into: Path) -> Path:
    """``src/`` of git revision ``rev`` under ``into``; returns that ``src`` folder."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", rev, "src"], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def start_workers(threads: int, source: Path, baseline: Path | None) -> list[Worker]:
    w, t = HERE / "workers", str(threads)
    env = {"OMP_NUM_THREADS": t}
    ti_argv = [str(w / "turboinfer_worker.py"), str(MODEL), t, "none"]
    workers = [
        Worker("CTranslate2 fp32", PEERS / "ct2" / "bin" / "python",
               [str(w / "ct2_worker.py"), f"{MODEL}-ct2-float32", t], env),
        Worker("turboinfer fp32", Path(sys.executable), ti_argv,
               {**env, "PYTHONPATH": str(source)}),
    ]
    if baseline is not None:
        workers.append(Worker("turboinfer-baseline fp32", Path(sys.executable), ti_argv,
                              {**env, "PYTHONPATH": str(baseline)}))
    return workers


def _describe(rev: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%h %s", rev],
                          check=True, capture_output=True, text=True).stdout.strip()[:120]


def per_round_ratios(rounds: list[dict[str, Any]], num: str, den: str) -> dict[str, Any]:
    """den's wall time over num's per round (> 1: num faster); median, min, max, all."""
    out: dict[str, Any] = {}
    for metric in ("ttft", "b1", "b16"):
        vals = [r["runs"][den][metric]["wall_s"] / r["runs"][num][metric]["wall_s"]
                for r in rounds]
        out[metric] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals),
                       "rounds": vals}
    return out


def summary(rounds: list[dict[str, Any]], key: str, info: dict[str, Any]) -> dict[str, float]:
    """Medians over rounds; for turboinfer also the batch-1 decode rate's fraction of the
    bandwidth roofline (bytes of weights per token over the read bandwidth of its round)."""
    runs = [r["runs"][key] for r in rounds]
    row = {"ttft512_ms": statistics.median(1e3 * x["ttft"]["wall_s"] for x in runs),
           "b1_tps": statistics.median(GEN_LEN / x["b1"]["wall_s"] for x in runs),
           "b16_tps": statistics.median(BATCH * GEN_LEN / x["b16"]["wall_s"] for x in runs)}
    if runs[0]["b1"]["ttft_s"] is not None:
        decode = [(GEN_LEN - 1) / (x["b1"]["wall_s"] - x["b1"]["ttft_s"]) for x in runs]
        row["b1_decode_tps"] = statistics.median(decode)
        if "bytes_per_token" in info:
            row["roofline_fraction"] = statistics.median(
                d * info["bytes_per_token"] / r["bandwidth"]
                for d, r in zip(decode, rounds, strict=True))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--revision", default="", help="the git revision to measure "
                        "(default: this checkout's working tree)")
    parser.add_argument("--baseline", default="", help="a git revision to measure beside")
    parser.add_argument("--out", default=str(HERE / "prefill_probe.json"))
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from turboinfer.llm.bench import measure_read_bandwidth

    started, load_start = time.time(), os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        baseline = (extract_revision(args.baseline, Path(tmp) / "baseline") if args.baseline
                    else None)
        source = (extract_revision(args.revision, Path(tmp) / "revision") if args.revision
                  else REPO / "src")
        workers = start_workers(args.threads, source, baseline)
        for w in workers:   # warm-up: first calls pay one-off allocations
            w.generate(make_prompts(2, 16, 0), 4)
        rounds: list[dict[str, Any]] = []
        for i in range(args.rounds):
            order = workers[i % len(workers):] + workers[:i % len(workers)]
            ttft_prompt = make_prompts(1, TTFT_PROMPT, 7000 + 100 * i)
            b1_prompt = make_prompts(1, PROMPT_LEN, 7001 + 100 * i)
            b16_prompts = make_prompts(BATCH, PROMPT_LEN, 7016 + 100 * i)
            rnd: dict[str, Any] = {"load_average": os.getloadavg(),
                                   "bandwidth": measure_read_bandwidth(args.threads)["bandwidth"],
                                   "order": [w.key for w in order], "runs": {}}
            for w in order:
                rnd["runs"][w.key] = {"ttft": w.generate(ttft_prompt, 1),
                                      "b1": w.generate(b1_prompt, GEN_LEN),
                                      "b16": w.generate(b16_prompts, GEN_LEN)}
                r = rnd["runs"][w.key]
                print(f"round {i + 1}: {w.key}: ttft {1e3 * r['ttft']['wall_s']:.0f} ms, "
                      f"b1 {GEN_LEN / r['b1']['wall_s']:.1f} tok/s, "
                      f"b16 {BATCH * GEN_LEN / r['b16']['wall_s']:.1f} tok/s "
                      f"(load {rnd['load_average'][0]:.1f})", file=sys.stderr, flush=True)
            rounds.append(rnd)
        for w in workers:
            w.close()
    keys = [w.key for w in workers]
    ids = {k: rounds[-1]["runs"][k]["b16"]["ids"] for k in keys}
    results: dict[str, Any] = {
        "machine": {"cpu": cpu_model(), "logical_cores": os.cpu_count(),
                    "threads": args.threads, "load_average_at_start": load_start,
                    "load_average_at_end": os.getloadavg(), "seconds": time.time() - started},
        "command": " ".join(["prefill_probe.py", *sys.argv[1:]]),
        "revision": (_describe(args.revision) if args.revision
                     else _describe("HEAD") + " + working tree"),
        "baseline": _describe(args.baseline) if args.baseline else None,
        "settings": {"ttft_prompt_len": TTFT_PROMPT, "prompt_len": PROMPT_LEN,
                     "gen_len": GEN_LEN, "batch": BATCH, "rounds": args.rounds},
        "summary": {k: summary(rounds, k, w.info) for k, w in zip(keys, workers, strict=True)},
        "bytes_per_token": {k: w.info.get("bytes_per_token") for k, w in zip(keys, workers,
                                                                           strict=True)},
        "ratios": {f"{k} / CTranslate2 fp32": per_round_ratios(rounds, k, "CTranslate2 fp32")
                   for k in keys if k != "CTranslate2 fp32"},
        # Greedy ids of the last batch-16 run equal CTranslate2 fp32's (which equal
        # transformers' on this model, compare.json).
        "b16_ids_equal_ctranslate2": {k: ids[k] == ids["CTranslate2 fp32"] for k in keys},
        "kernels": {k: w.info.get("kernels") for k, w in zip(keys, workers, strict=True)},
        "rounds": [{**r, "runs": {k: {m: {f: v for f, v in x.items() if f != "ids"}
                                      for m, x in runs.items()}
                                  for k, runs in r["runs"].items()}} for r in rounds],
    }
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    for k, row in results["summary"].items():
        print(k, {m: round(v, 1) for m, v in row.items()})
    for k, rat in results["ratios"].items():
        print(k, {m: f"{v['median']:.2f}x ({v['min']:.2f}-{v['max']:.2f})"
                  for m, v in rat.items()})


if __name__ == "__main__":
    main()
