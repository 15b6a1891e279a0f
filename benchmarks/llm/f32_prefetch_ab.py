"""Speculative decoding on the demo model at several values of the fp32 kernel's ``f32``
setting (how it runs several rows: the 256-bit tiles with the next-tile fetch off or on,
below 1024; from 1024, where the CPU has AVX-512, the 512-bit passes fetching that many
bytes ahead), in one process, interleaved.

    python benchmarks/llm/f32_prefetch_ab.py [--rounds 6] [--settings NAME=VALUE,...]
        [--output FILE]

The engines and workloads of ``run.py --sections speculative`` (plain, the demo draft,
prompt lookup; the demo prompts and the repetitive workload), one thread. Each round sets
the setting for every engine (the build's own measured choice is recorded first), then
runs one interleaved round of ``run.py``'s protocol; the settings' order alternates
round by round. Reported per setting: the medians over its rounds of plain tokens/CPU-s and of the
speed-ups. Writes ``--output`` (default ``f32_prefetch_ab.json``) beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from native_kernels import machine  # noqa: E402
from run import regenerate_prompts, spec_rounds, warm  # noqa: E402

from turboinfer.hardware import profile  # noqa: E402
from turboinfer.llm import LLM, EngineConfig, demo_model_dir  # noqa: E402
from turboinfer.llm.backends.cpu.native import native_status  # noqa: E402

SETTINGS = "off=0,next tile=256"


def parse_settings(text: str) -> dict[str, int]:
    """``NAME=VALUE,...`` as {name: value}."""
    pairs = (item.split("=", 1) for item in text.split(","))
    return {name.strip(): int(value) for name, value in pairs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--settings", type=parse_settings, default=parse_settings(SETTINGS),
                        help=f"NAME=VALUE,... of the f32 setting (default {SETTINGS!r})")
    parser.add_argument("--output", type=Path, default=HERE / "f32_prefetch_ab.json")
    args = parser.parse_args()
    settings: dict[str, int] = args.settings
    library = native_status().library
    if library is None:
        sys.exit(f"native kernels absent: {native_status().reason}")
    load_before = os.getloadavg()
    one = EngineConfig(num_threads=1)
    plain = warm(LLM(config=one))
    decoder = plain.engine.runner.native_decoder()
    measured = decoder.f32_prefetch.to_dict() if decoder and decoder.f32_prefetch else None
    variants = {"draft": warm(LLM(draft=demo_model_dir("draft"), config=EngineConfig(
                    num_speculative_tokens=6, num_threads=1))),
                "ngram": warm(LLM(ngram=3, config=EngineConfig(num_speculative_tokens=8,
                                                               num_threads=1)))}
    workloads = {"demo": ["Return a new list containing", "The default value of the timeout",
                          "If the file does not exist,"],
                 "regenerate": regenerate_prompts(plain, 8, 64)}
    protocol = argparse.Namespace(gen_len=64, spec_rounds=1, spec_repeats=2)
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in settings}
    for i in range(args.rounds):
        for name in list(settings)[::1 if i % 2 == 0 else -1]:
            library.set_prefetch(settings[name], "f32")
            runs[name].append({w: spec_rounds(plain, variants, prompts, protocol)
                               for w, prompts in workloads.items()})
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for name, rounds in runs.items():
        summary[name] = {}
        for w in workloads:
            cells = [r[w] for r in rounds]
            row = {"plain_tps": statistics.median(c["plain_tps"] for c in cells)}
            for v in variants:
                ratios = [c[v]["speedup"] for c in cells]
                row[f"{v}_speedup"] = statistics.median(ratios)
                row[f"{v}_speedup_min"] = min(ratios)
            summary[name][w] = row
            print(f"{name:14s} {w:10s} plain {row['plain_tps']:7.1f} tok/CPU-s  draft "
                  f"{row['draft_speedup']:.2f}x (min {row['draft_speedup_min']:.2f})  ngram "
                  f"{row['ngram_speedup']:.2f}x (min {row['ngram_speedup_min']:.2f})",
                  flush=True)
    result = {"command": " ".join(sys.argv),
              "machine": {**profile(engines=False, gpus=False).summary(), **machine()},
              "threads": 1, "load_average": {"start": load_before, "end": os.getloadavg()},
              "measured_at_build": measured, "settings": settings, "summary": summary,
              "rounds": runs}
    args.output.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
