"""turboinfer's OpenAI server against llama-cpp-python's, side by side, through
``turboinfer llm load``: the random 110M Llama, prompt 64 / output 64, concurrency 1, 4
and 16; one server at a time, in interleaved rounds.

    python benchmarks/llm_serving/run.py [--rounds 2] [--peer-venv /work/peers/llamacpp-venv]

The peer's venv needs ``llama-cpp-python[server] gguf safetensors`` (see README.md).
Writes ``results.json`` here and prints the table README.md quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORK = Path("/work/peers")
CONCURRENCY = (1, 4, 16)
PROMPTS_PER_LEVEL = {1: 4, 4: 8, 16: 16}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(proc: subprocess.Popen[bytes], port: int, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit("server did not start")


def server_command(side: str, model: Path, gguf: Path, venv: Path, port: int) -> list[str]:
    if side == "turboinfer":
        return [sys.executable, "-m", "turboinfer", "llm", "serve", str(model),
                "--port", str(port), "--served-model-name", "bench"]
    # interrupt_requests off: by default a new request cuts the streaming one short.
    return [str(venv / "bin" / "python"), "-m", "llama_cpp.server", "--model", str(gguf),
            "--model_alias", "bench", "--host", "127.0.0.1", "--port", str(port),
            "--n_ctx", "1024", "--n_threads", "2", "--n_batch", "512",
            "--interrupt_requests", "False"]


def load_command(port: int, concurrency: int, model: Path) -> list[str]:
    # Greedy with llama.cpp's own sampling extras switched off, the same work on each side.
    extra = {"repeat_penalty": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    return [sys.executable, "-m", "turboinfer", "llm", "load", f"http://127.0.0.1:{port}",
            "--model", "bench", "--tokenizer", str(model), "--input-len", "64",
            "--output-len", "64", "--num-prompts", str(PROMPTS_PER_LEVEL[concurrency]),
            "--max-concurrency", str(concurrency), "--warmup", "1",
            "--extra-body", json.dumps(extra), "--json"]


def per_chunk(report: dict[str, Any]) -> dict[str, float]:
    """Tokens counted as streamed chunks: llama-cpp-python sends no usage in a stream and
    re-tokenizing a random model's text undercounts, but it streams one token per chunk
    (and min_tokens holds every request at its full length)."""
    done = [r for r in report["requests"] if r["error"] is None]
    chunks = [len(r["itl_ms"]) + 1 for r in done]
    tpot = [(r["e2el_ms"] - r["ttft_ms"]) / (n - 1)
            for r, n in zip(done, chunks, strict=True) if n > 1]
    return {"chunks": sum(chunks),
            "chunks_per_s": sum(chunks) / report["summary"]["duration_s"],
            "tpot_p50_ms": statistics.median(tpot) if tpot else 0.0}


def run_side(side: str, args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    port = free_port()
    cmd = server_command(side, args.model, args.gguf, args.peer_venv, port)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(proc, port)
        out = {}
        for c in CONCURRENCY:
            done = subprocess.run(load_command(port, c, args.model), capture_output=True,
                                  text=True, check=False)
            report = json.loads(done.stdout)
            out[c] = s = {**report["summary"], "per_chunk": per_chunk(report)}
            print(f"{side} c={c}: {s['output_throughput']:.1f} tok/s, ttft p50 "
                  f"{s['ttft']['p50']:.1f} ms, tpot p50 {s['tpot']['p50']:.1f} ms, "
                  f"failed {s['failed']}", file=sys.stderr)
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def median_row(rounds: list[dict[int, dict[str, Any]]], c: int) -> dict[str, float]:
    def med(f: Any) -> float:
        return statistics.median(f(r[c]) for r in rounds)

    return {"tokens_per_s": med(lambda s: s["output_throughput"]),
            "chunks_per_s": med(lambda s: s["per_chunk"]["chunks_per_s"]),
            "tpot_per_chunk_p50_ms": med(lambda s: s["per_chunk"]["tpot_p50_ms"]),
            "ttft_p50_ms": med(lambda s: s["ttft"]["p50"]),
            "ttft_p99_ms": med(lambda s: s["ttft"]["p99"]),
            "tpot_p50_ms": med(lambda s: s["tpot"]["p50"]),
            "tpot_p99_ms": med(lambda s: s["tpot"]["p99"]),
            "failed": med(lambda s: s["failed"]),
            "counted_by_server": med(lambda s: s["counted_by_server"] / max(s["completed"], 1))}


def markdown(results: dict[str, Any]) -> str:
    """Per round: 64 tokens per completed request on both sides (see README.md), and
    llama-cpp-python's TPOT per chunk since it sends no usage."""
    lines = ["| concurrency | server | round | output tok/s | TTFT p50 ms | TTFT p99 ms "
             "| TPOT p50 ms |", "|---|---|---|---|---|---|---|"]
    for c in CONCURRENCY:
        for side, rounds in results["rounds"].items():
            for i, r in enumerate(rounds, 1):
                s = r[c]
                tpot = s["tpot"]["p50"] if side == "turboinfer" else s["per_chunk"]["tpot_p50_ms"]
                lines.append(f"| {c} | {side} | {i} | {s['completed'] * 64 / s['duration_s']:.1f} "
                             f"| {s['ttft']['p50']:.0f} | {s['ttft']['p99']:.0f} | {tpot:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--peer-venv", type=Path, default=WORK / "llamacpp-venv")
    parser.add_argument("--model", type=Path, default=WORK / "llm110m")
    parser.add_argument("--gguf", type=Path, default=WORK / "llm110m-f32.gguf")
    args = parser.parse_args()
    subprocess.run([sys.executable, str(HERE / "build_model.py"), str(args.model)], check=True)
    if not args.gguf.is_file():
        subprocess.run([str(args.peer_venv / "bin" / "python"), str(HERE / "to_gguf.py"),
                        str(args.model), str(args.gguf)], check=True)
    sides = {"turboinfer": [], "llama-cpp-python": []}
    for i in range(args.rounds):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for side in order:
            sides[side].append(run_side(side, args))
    results = {"machine": {"cpu": cpu_model(), "logical_cores": len(os.sched_getaffinity(0))},
               "rounds": sides,
               "median": {side: {str(c): median_row(rounds, c) for c in CONCURRENCY}
                          for side, rounds in sides.items()}}
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(markdown(results))


if __name__ == "__main__":
    main()
