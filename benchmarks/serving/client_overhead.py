"""The load generator's own ceiling: requests/s from one client process against a
server that answers at once (``python -m turboinfer.load.instant``), for turboinfer's
raw-asyncio client and, for reference, a plain aiohttp client doing the same loop.

    python benchmarks/serving/client_overhead.py [--seconds 3] [--levels 1,8,64]

Prints a Markdown table and keeps the raw figures in ``client_overhead.json`` beside this
script (``--output`` elsewhere); benchmarks/README.md ("Serving") quotes that file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
INFER_BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                                     "data": [0.0] * 16}]}).encode()


def start_instant() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen([sys.executable, "-m", "turboinfer.load.instant"],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, process.stdout.readline().split()[4]


def turboinfer_qps(url: str, level: int, seconds: float) -> tuple[float, float]:
    """(req/s, client CPU share) from ``turboinfer load --scenario concurrency``."""
    out = subprocess.run(
        [sys.executable, "-m", "turboinfer", "load", url, "--model", "instant",
         "--scenario", "concurrency", "--concurrency", str(level), "--window",
         str(seconds / 3), "--max-windows", "3", "--stability", "10", "--warmup", "0.5",
         "--no-metrics", "--json"], capture_output=True, text=True, check=True).stdout
    run = json.loads(out)["runs"][0]
    return run["qps"], run["client_cpu"]


async def _aiohttp_loop(url: str, level: int, seconds: float) -> float:
    import aiohttp

    done = 0
    end = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < end:
                async with session.post(f"{url}/v2/models/instant/infer",
                                        data=INFER_BODY) as response:
                    await response.read()
                    done += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(level)))
        return done / (time.perf_counter() - start)


def aiohttp_qps(url: str, level: int, seconds: float) -> float | None:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        return None
    return asyncio.run(_aiohttp_loop(url, level, seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--levels", default="1,8,64")
    parser.add_argument("--output", type=Path, default=HERE / "client_overhead.json")
    args = parser.parse_args()
    rows: list[dict[str, float | int | None]] = []
    load_before = os.getloadavg()
    process, url = start_instant()
    try:
        print("| concurrency | turboinfer load (req/s) | its CPU (share of a core) "
              "| aiohttp loop (req/s) |")
        print("|---|---|---|---|")
        for level in (int(x) for x in args.levels.split(",")):
            qps, cpu = turboinfer_qps(url, level, args.seconds)
            reference = aiohttp_qps(url, level, args.seconds)
            ref = f"{reference:,.0f}" if reference is not None else "not installed"
            print(f"| {level} | {qps:,.0f} | {cpu:.0%} | {ref} |", flush=True)
            rows.append({"concurrency": level, "turboinfer_qps": qps, "turboinfer_client_cpu": cpu,
                         "aiohttp_qps": reference})
    finally:
        process.terminate()
        process.wait(10)
    args.output.write_text(json.dumps({
        "seconds": args.seconds, "load_average_before": load_before,
        "load_average_after": os.getloadavg(), "rows": rows}, indent=1) + "\n")
    print(f"raw results: {args.output}")


if __name__ == "__main__":
    main()
