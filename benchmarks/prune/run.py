"""Record the pruning acceptance numbers: every configuration pruned and timed in one run.

    python benchmarks/prune/run.py [--out benchmarks/prune/results.json] [--only NAME ...]

Each configuration goes through ``prune_builtin`` (the code behind ``turboinfer prune``);
ONNX Runtime latency of the original and the pruned file is measured interleaved, in
rounds, within that configuration (median of per-round p50s; p99 over all runs). Torch
runs on one thread for ranking and distillation: on a shared two-core machine two
spinning OpenMP threads made small convolutions ten times slower.
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import torch

from turboinfer.prune.measure import LatencySettings
from turboinfer.prune.pipeline import prune_builtin
from turboinfer.prune.settings import DistillSettings, Protect, PruneSettings


@dataclass(frozen=True)
class Config:
    name: str
    model: str
    settings: PruneSettings
    claim: str
    extra_text: bool = False  # pass reference_text() as --train-data


def reference_text(path: Path, limit: int = 1500) -> Path:
    """Plain English sentences that ship with Python (its reference documentation topics).

    The extra text a user would give ``turboinfer prune builtin:minilm --train-data``;
    the held-out evaluation sentences are the zoo's bundled ones, never these.
    """
    import pydoc_data.topics

    prose = re.sub(r"\s+", " ", " ".join(pydoc_data.topics.topics.values()))
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", prose)
                 if 8 <= len(s.split()) <= 40 and not re.search(r"[>{}\[\]=_*|`]", s)]
    path.write_text("\n".join(sentences[:limit]) + "\n", "utf-8")
    return path


LAST = frozenset({Protect.LAST})
CONFIGS = (
    Config("digits-cnn", "builtin:digits-cnn",
           PruneSettings(target_sparsity=0.5, distill=DistillSettings(epochs=10)),
           "50%, first+last protected (default)"),
    Config("digits-cnn-last", "builtin:digits-cnn",
           PruneSettings(target_sparsity=0.5, protect=LAST, distill=DistillSettings(epochs=10)),
           "50%, only the last layer protected"),
    Config("resnet18", "builtin:resnet18",
           PruneSettings(target_sparsity=0.5, batch_size=8, taylor_batches=2,
                         distill=DistillSettings(epochs=0)),
           "50%, random weights: speed only"),
    Config("resnet18-2:4", "builtin:resnet18",
           PruneSettings(target_sparsity=0.5, batch_size=8, taylor_batches=2,
                         semi_structured=True, distill=DistillSettings(epochs=0)),
           "50% + 2:4 on the remaining weights: dense vs 2:4 latency"),
    Config("minilm", "builtin:minilm",
           PruneSettings(target_sparsity=0.3, batch_size=32,
                         distill=DistillSettings(epochs=3, lr=3e-4)),
           "30% of heads and FFN channels, sequence 128, bundled + reference text",
           extra_text=True),
)


def run(config: Config, latency: LatencySettings) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        text = reference_text(Path(tmp) / "text.txt") if config.extra_text else None
        report = prune_builtin(config.model, config.settings, Path(tmp) / "out",
                               train_path=text, latency=latency)
        data = report.to_dict()
    data["config"] = {"name": config.name, "claim": config.claim,
                      "seconds": round(time.perf_counter() - started, 1)}
    del data["files"]  # temporary paths
    return data


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("results.json"))
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(1)
    latency = LatencySettings(batch_size=1, rounds=args.rounds, seconds_per_round=0.5)
    results = []
    for config in CONFIGS:
        if args.only and config.name not in args.only:
            continue
        results.append(run(config, latency) | {"load_average": os.getloadavg()})
        print(summary(results[-1]), flush=True)
    args.out.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2 |
                                      orjson.OPT_SERIALIZE_NUMPY))


def summary(r: dict[str, Any]) -> str:
    lat, m = r["latency_onnxruntime"], r["metric"]
    cells = [r["config"]["name"], f"MACs {r['macs']['reduction']:.2f}x",
             f"params {r['parameters']['reduction']:.2f}x",
             f"{m['name']} {m['before']:.4g} -> {m['after_pruning']:.4g} -> "
             f"{m['after_distillation']:.4g}"]
    cells += [f"{k} p50 {v['p50_ms']:.3f} p99 {v['p99_ms']:.3f}" for k, v in lat.items()]
    cells.append(f"speed-up {r['speedup_p50']:.2f}x")
    return " | ".join(cells)


if __name__ == "__main__":
    main()
