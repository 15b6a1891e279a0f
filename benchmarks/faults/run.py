"""Run the fault-injection scenarios (``pytest -s -m slow tests/faults``) and keep their
figures: each scenario test prints one line with its requests sent / answered / failed
and the server's RSS before / peak / after. Those lines, the figures read from them, the
machine and its load average are written to ``results.json`` beside this script
(``--output`` elsewhere); the README's table is read from that file. Beside them, the
memory peak of decoding a ~10 MB all-JSON tensor request: the server's decoder
(``decode_request``, msgspec) against the Python-list detour (orjson to lists, then
numpy), both under tracemalloc.

    python benchmarks/faults/run.py            # run, write results.json, print the table
    python benchmarks/faults/run.py --table    # the README's table from results.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from turboinfer.serve.protocol import decode_request

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
COMMAND = [sys.executable, "-m", "pytest", "-s", "-q", "-m", "slow", "-p", "no:cacheprovider",
           "tests/faults"]
# A scenario's line: "name: ... sent N answered N ... failed N ...".
LINE = re.compile(r"^(?P<name>[a-z][a-z ]*): .*\bsent \d+ answered \d+")


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _commit() -> str:
    """The commit the scenarios ran on, with "+changes" when the tree differs from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "src", "tests"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+changes" if dirty.strip() else "")


def _number(pattern: str, line: str) -> int | None:
    found = re.search(pattern, line)
    return int(found.group(1)) if found else None


def scenario(line: str) -> dict[str, Any] | None:
    """The figures of one printed scenario line, or None if it is not one."""
    match = LINE.match(line)
    if match is None:
        return None
    rss = re.search(r"RSS MiB before (\d+) peak (\d+) after (\d+)", line)
    return {
        "name": match.group("name"),
        "sent": _number(r"\bsent (\d+)", line),
        "answered": _number(r"\banswered (\d+)", line),
        "failed": _number(r"\bfailed (\d+)", line),
        "rss_mib": dict(zip(("before", "peak", "after"), map(int, rss.groups()), strict=True))
        if rss else None,
        "line": line,
    }


def _peak(decode: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        decode()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def json_parsing() -> dict[str, Any]:
    """Peak traced memory decoding the body of tests/serve/test_body_limits.py's JSON
    case (60,000 rows of 16 FP32), as bytes and as a multiple of the body."""
    data = np.random.default_rng(0).random((60_000, 16)).astype(np.float32).round(4)
    body = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                     "shape": [60_000, 16], "data": data.tolist()}]})
    peaks = {
        "decode_request": _peak(lambda: decode_request(body, None)),
        "orjson_lists_then_numpy": _peak(lambda: np.asarray(
            orjson.loads(body)["inputs"][0]["data"], np.float32)),
    }
    return {"body_bytes": len(body), "peak_bytes": peaks,
            "peak_over_body": {k: round(v / len(body), 1) for k, v in peaks.items()}}


def table(result: dict[str, Any]) -> str:
    """The README's Markdown table of the scenarios' figures."""
    rows = ["| scenario | sent | answered | failed | server RSS MiB before / peak / after |",
            "|---|---|---|---|---|"]
    for item in result["scenarios"]:
        rss = item["rss_mib"]
        memory = f"{rss['before']} / {rss['peak']} / {rss['after']}" if rss else "-"
        rows.append(f"| {item['name']} | {item['sent']} | {item['answered']} | "
                    f"{item['failed']} | {memory} |")
    parsing = result["json_parsing"]
    rows += ["", f"JSON body of {parsing['body_bytes'] / 1e6:.1f} MB: peak "
             + ", ".join(f"{name} {peak / 1e6:.0f} MB ({parsing['peak_over_body'][name]}x)"
                         for name, peak in parsing["peak_bytes"].items())]
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=HERE / "results.json")
    parser.add_argument("--table", action="store_true",
                        help="print the table from --output and run nothing")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.output.read_text())))
        return 0
    load_before = os.getloadavg()
    start = time.perf_counter()
    run = subprocess.run(COMMAND, cwd=ROOT, capture_output=True, text=True)
    duration = time.perf_counter() - start
    scenarios = [s for s in map(scenario, run.stdout.splitlines()) if s is not None]
    result = {
        "command": "pytest -s -q -m slow tests/faults",
        "recorded_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": _commit(),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "duration_s": round(duration, 1),
        "pytest_exit_code": run.returncode,
        "pytest_summary": (run.stdout.strip().splitlines() or [""])[-1],
        "scenarios": scenarios,
        "json_parsing": json_parsing(),
    }
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    for item in scenarios:
        print(item["line"])
    print(f"{result['pytest_summary']}; written to {args.output}")
    print(table(result))
    if run.returncode != 0:
        print(run.stdout[-5000:], run.stderr[-2000:], sep="\n", file=sys.stderr)
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
