"""What structured output costs per token: TPOT of requests constrained by a JSON schema
against the same requests unconstrained, on the demo model, at batch 1 and 16, in
interleaved rounds.

    python benchmarks/llm/structured_tpot.py [--rounds 5 --tokens 64] [--model DIR|FILE.gguf]

The schema (an array of at least 40 small objects with a string, an enum and an integer)
keeps the constrained text going for the whole ``--tokens``, so both sides time the same
number of steps; the unconstrained side ignores EOS for the same reason. TPOT is each
request's mean time per output token after the first (the engine's own timing), median
over requests, then median over rounds. Writes ``--output`` (``structured_tpot.json``)
beside this script.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch

from turboinfer.hardware import profile
from turboinfer.llm import LLM, SamplingParams
from turboinfer.llm.engine.structured import StructuredOutput

HERE = Path(__file__).resolve().parent
SCHEMA = {"type": "array", "minItems": 40, "items": {
    "type": "object", "additionalProperties": False, "required": ["name", "kind", "n"],
    "properties": {"name": {"type": "string", "maxLength": 8},
                   "kind": {"enum": ["module", "class", "function"]},
                   "n": {"type": "integer", "minimum": 0, "maximum": 999}}}}


def tpot_ms(llm: LLM, batch: int, tokens: int, structured: StructuredOutput | None) -> float:
    params = [SamplingParams(max_tokens=tokens, temperature=1.0, seed=i, ignore_eos=True,
                             structured=structured) for i in range(batch)]
    outputs = llm.generate(["Return the items as JSON: "] * batch, params)
    return statistics.median(o.tpot_s for o in outputs) * 1e3


def _cpu() -> dict[str, object]:
    """The CPU as the project's hardware probe names it, with its ISA features."""
    cpu = profile(engines=False, gpus=False).cpu
    return {"cpu": cpu.model_name, "isa": sorted(cpu.features)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--model", default=None, help="default: the demo model")
    parser.add_argument("--output", default="structured_tpot.json")
    args = parser.parse_args()
    llm = LLM(args.model)
    constrained = StructuredOutput.json_schema(SCHEMA)
    tpot_ms(llm, 2, 8, constrained)  # warm up: llguidance's view of the vocabulary
    rows: dict[str, dict[str, list[float]]] = {}
    for round_ in range(args.rounds):
        for batch in (1, 16):
            sides = [("plain", None), ("json_schema", constrained)]
            for label, structured in sides if round_ % 2 == 0 else sides[::-1]:
                value = tpot_ms(llm, batch, args.tokens, structured)
                rows.setdefault(f"batch_{batch}", {}).setdefault(label, []).append(value)
    summary = {key: {label: statistics.median(values) for label, values in sides_.items()}
               for key, sides_ in rows.items()}
    for values in summary.values():
        values["ratio"] = values["json_schema"] / values["plain"]
    result = {"command": "python benchmarks/llm/structured_tpot.py " + " ".join(
                  f"--{k} {v}" for k, v in vars(args).items() if v is not None),
              "machine": {**_cpu(), "cores": os.cpu_count(),
                          "torch_threads": torch.get_num_threads(),
                          "load_average_1m": os.getloadavg()[0]},
              "tpot_ms": summary, "rounds": rows}
    (HERE / args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary, indent=1))



if __name__ == "__main__":
    main()
