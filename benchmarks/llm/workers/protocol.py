"""The line protocol every benchmark worker speaks (stdlib only: peers' venvs import it).

The driver writes one JSON request per line on stdin; the worker answers one JSON line on
stdout: ``{"op": "generate", "prompts": [[ids]], "gen": N}`` -> ``{"ids": [[ids]],
"wall_s": .., "cpu_s": .., "ttft_s": .. or null}``. ``ttft_s`` is the time to the first
generated token of the first prompt where the engine exposes it. Anything else the
worker prints goes to stderr.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

# (prompts, tokens to generate) -> (generated ids per prompt, seconds to the first token)
Generate = Callable[[list[list[int]], int], tuple[list[list[int]], "float | None"]]


def serve(generate: Generate, info: dict[str, Any]) -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # libraries' prints must not corrupt the protocol
    out.write(json.dumps({"ready": True, "pid": os.getpid(), **info}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "quit":
            break
        start, cpu = time.perf_counter(), time.process_time()
        ids, ttft = generate(req["prompts"], req["gen"])
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        out.write(json.dumps({"ids": ids, "wall_s": wall, "cpu_s": cpu, "ttft_s": ttft}) + "\n")
        out.flush()
