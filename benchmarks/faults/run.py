"""Run the fault-injection scenarios (``pytest -s -m slow tests/faults``) and keep their
figures: each scenario test prints one line with its requests sent / answered / failed
and the server's RSS before / peak / after. Those lines, the figures read from them, the
machine and its load average are written to ``results.json`` beside this script
(``--output`` elsewhere); the README's table is read from that file.

    python benchmarks/faults/run.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=HERE / "results.json")
    args = parser.parse_args()
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
    }
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    for item in scenarios:
        print(item["line"])
    print(f"{result['pytest_summary']}; written to {args.output}")
    if run.returncode != 0:
        print(run.stdout[-5000:], run.stderr[-2000:], sep="\n", file=sys.stderr)
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
