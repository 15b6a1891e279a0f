"""GPU acceptance of the torch engine and serving on it, in one run, side by side.

1. In process: builtin:resnet50 on the torch engine in eager FP32, FP16, FP16 +
   channels_last, FP16 + channels_last + CUDA graphs (and torch.compile with --compile),
   at batch 1 and 64, each timed host to host (numpy input in host memory to numpy output
   back) after warm-up, with CUDA events on the session's stream beside; then plain torch
   done by hand (FP16 + channels_last + a CUDA graph, pinned copies) as the reference.
2. The real server: `turboinfer serve` over a repository entry on the torch engine
   (device cuda, the graphed form), driven by `turboinfer load --scenario concurrency`
   at a few client counts, with /metrics scraped meanwhile for GPU utilisation; and the
   same model on ONNX Runtime on the CPU at the highest count, for the ratio.
3. Every figure printed, and one JSON written (--out).

On the GPU machine (Python 3.12, torch 2.11 + CUDA 13, onnx, onnxruntime; no network),
from the checkout's root, with the wheels fetched beforehand on a networked machine by
`../shared/gpu/fetch-wheels.sh wheels` into the checkout's git-ignored `wheels/`:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site wheels/*.whl
    PYTHONPATH=/tmp/site:$PWD/src python3 benchmarks/gpu/serve_acceptance.py \
        --out benchmarks/gpu/serve_acceptance.json          # about 3-5 minutes

On a CPU (the same code paths, smaller): PYTHONPATH=src python benchmarks/gpu/serve_acceptance.py
--device cpu --quick (FP32 and BF16 forms, batch 1 and 8, builtin:digits-cnn; under 2 min).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from turboinfer.engines import (
    CompileMode,
    EngineSettings,
    Precision,
    Toggle,
    load_session,
)
from turboinfer.hardware import profile
from turboinfer.models import ResolvedModel, resolve_model
from turboinfer.serve.config import ModelConfig, write_entry


def forms(device: str, with_compile: bool) -> dict[str, dict[str, Any]]:
    """The engine settings of each form, by name."""
    if device == "cpu":
        found = {"eager fp32": {}, "bf16": {"precision": Precision.BF16},
                 "fp32 + channels_last": {"channels_last": Toggle.ON}}
        if with_compile:
            found["fp32 + compile"] = {"compile": CompileMode.DEFAULT}
        return found
    fp16 = {"precision": Precision.FP16}
    nhwc = {**fp16, "channels_last": Toggle.ON}
    found = {"eager fp32": {}, "fp16": fp16, "fp16 + channels_last": nhwc,
             "fp16 + channels_last + cuda graphs": {**nhwc, "cuda_graphs": True}}
    if with_compile:
        found["fp16 + channels_last + compile + cuda graphs"] = {
            **nhwc, "cuda_graphs": True, "compile": CompileMode.MAX_AUTOTUNE_NO_CUDAGRAPHS}
    return found


def time_runs(run: Callable[[], object], seconds: float, min_runs: int,
              stream: Any = None) -> dict[str, float]:
    """p50/p99/mean of host-to-host wall time after warm-up; with a CUDA stream, the
    CUDA-event time on it too (its GPU work, launch gaps included)."""
    for _ in range(5):
        run()
    walls: list[float] = []
    events: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(walls) < min_runs or time.perf_counter() < deadline:
        if stream is not None:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
        begin = time.perf_counter()
        run()
        walls.append((time.perf_counter() - begin) * 1e3)
        if stream is not None:
            end.record(stream)
            end.synchronize()
            events.append(start.elapsed_time(end))
    walls.sort()
    out = {"p50_ms": statistics.median(walls), "p99_ms": walls[int(0.99 * (len(walls) - 1))],
           "mean_ms": statistics.fmean(walls), "runs": len(walls)}
    if events:
        out["cuda_event_p50_ms"] = statistics.median(events)
    return out


def bench_engine(model: ResolvedModel, device: str, batches: list[int], seconds: float,
                 with_compile: bool) -> list[dict[str, Any]]:
    rows = []
    for name, overrides in forms(device, with_compile).items():
        settings = EngineSettings(device=device, max_batch_size=max(batches), **overrides)
        start = time.perf_counter()
        session = load_session(model.artifact, "torch", settings)
        load_s = time.perf_counter() - start
        stream = getattr(getattr(session, "runner", None), "stream", None)
        for batch in batches:
            feeds = example(model, batch)
            figures = time_runs(lambda feeds=feeds, session=session: session.run(feeds),
                                seconds, 10, stream)
            row = {"form": name, "batch_size": batch, "load_s": round(load_s, 2), **figures,
                   "samples_per_s": batch / figures["mean_ms"] * 1e3}
            rows.append(row)
            print(f"  torch {name:<45} batch {batch:>3}: p50 {figures['p50_ms']:8.3f} ms "
                  f"({row['samples_per_s']:9.1f}/s)", flush=True)
        del session
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def bench_reference(model: ResolvedModel, device: str, batches: list[int],
                    seconds: float) -> list[dict[str, Any]]:
    """Plain torch by hand: on CUDA FP16 + channels_last + one CUDA graph per batch size,
    pinned host buffers, copies on a side stream; on the CPU eager FP32 in inference mode."""
    assert model.entry is not None
    module = model.entry.build().eval()
    rows = []
    if device == "cpu":
        for batch in batches:
            x = torch.from_numpy(example(model, batch)[model.entry.input_names[0]])

            def run(x: torch.Tensor = x) -> object:
                with torch.inference_mode():
                    return module(x).numpy()

            rows.append({"form": "plain torch eager fp32", "batch_size": batch,
                         **time_runs(run, seconds, 10)})
            print(f"  reference plain torch eager fp32 batch {batch}: "
                  f"p50 {rows[-1]['p50_ms']:.3f} ms", flush=True)
        return rows
    module = module.cuda().half().to(memory_format=torch.channels_last)
    stream = torch.cuda.Stream()
    for batch in batches:
        host_in = torch.from_numpy(example(model, batch)[model.entry.input_names[0]])
        pinned_in = host_in.pin_memory()
        static_in = torch.empty_like(pinned_in, device="cuda")
        with torch.inference_mode():
            with torch.cuda.stream(stream):
                for _ in range(3):
                    module(static_in.half().contiguous(memory_format=torch.channels_last))
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                static_out = module(static_in.half().contiguous(
                    memory_format=torch.channels_last)).float()
        pinned_out = torch.empty(static_out.shape, dtype=torch.float32, pin_memory=True)
        array = host_in.numpy()

        def run(array: np.ndarray = array, pinned_in: torch.Tensor = pinned_in,
                static_in: torch.Tensor = static_in, graph: Any = graph,
                static_out: torch.Tensor = static_out,
                pinned_out: torch.Tensor = pinned_out) -> np.ndarray:
            np.copyto(pinned_in.numpy(), array)
            with torch.cuda.stream(stream):
                static_in.copy_(pinned_in, non_blocking=True)
                graph.replay()
                pinned_out.copy_(static_out, non_blocking=True)
            stream.synchronize()
            return pinned_out.numpy().copy()

        figures = time_runs(run, seconds, 10, stream)
        rows.append({"form": "plain torch fp16 + channels_last + cuda graph",
                     "batch_size": batch, **figures,
                     "samples_per_s": batch / figures["mean_ms"] * 1e3})
        print(f"  reference fp16+channels_last+graph batch {batch:>3}: "
              f"p50 {figures['p50_ms']:8.3f} ms", flush=True)
    return rows


def example(model: ResolvedModel, batch: int) -> dict[str, np.ndarray]:
    assert model.entry is not None
    return dict(model.entry.example_inputs(batch))


# --- the server ------------------------------------------------------------------------


def write_repo(root: Path, model: ResolvedModel, device: str, max_batch: int,
               cpu_baseline: bool) -> dict[str, str]:
    """The torch entry (and an onnxruntime CPU entry for the ratio); name -> engine."""
    settings = ({"device": "cuda", "precision": "fp16", "channels_last": "on",
                 "cuda_graphs": True} if device == "cuda" else {"device": "cpu"})
    entry = root / f"{model.name}-torch"
    (entry / "1").mkdir(parents=True)
    (entry / "config.yaml").write_text(json.dumps({
        "engine": "torch", "source": f"builtin:{model.name}", "max_batch_size": max_batch,
        "dynamic_batching": {"max_queue_delay_ms": 1.0}, "engine_settings": settings}))
    names = {entry.name: "torch"}
    if cpu_baseline:
        config = ModelConfig.model_validate({"max_batch_size": max_batch,
                                             "dynamic_batching": {"max_queue_delay_ms": 1.0}})
        write_entry(root, f"{model.name}-cpu", model.artifact.onnx_path, config)
        names[f"{model.name}-cpu"] = "onnxruntime"
    return names


@contextlib.contextmanager
def serving(repo: Path, log: Path) -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "turboinfer", "serve", str(repo), "--http-port", "0",
         "--grpc-port", "-1", "--model-control", "none"],
        stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        if not line.startswith("turboinfer serving"):
            raise RuntimeError(f"the server did not start: {line!r}; see {log}")
        yield "http://" + line.split("http=", 1)[1].split()[0]
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


class GpuScraper:
    """/metrics every half second: the GPU utilisation and memory samples, and whether
    the families are filled at all (they are only while a model runs on a GPU)."""

    PATTERN = re.compile(r'^turboinfer_gpu_(utilisation_ratio|memory_used_bytes|'
                         r'process_allocated_bytes)\{([^}]*)\} ([0-9.eE+-]+)$', re.M)

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: dict[str, list[float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(OSError):
                text = urllib.request.urlopen(f"{self.url}/metrics", timeout=5).read().decode()
                for family, _, value in self.PATTERN.findall(text):
                    self.samples.setdefault(family, []).append(float(value))

    def __enter__(self) -> GpuScraper:
        self.samples = {}
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._stop.clear()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float | None]:
        util = self.samples.get("utilisation_ratio", [])
        used = self.samples.get("memory_used_bytes", [])
        held = self.samples.get("process_allocated_bytes", [])
        return {"gpu_utilisation_mean": statistics.fmean(util) if util else None,
                "gpu_utilisation_max": max(util) if util else None,
                "gpu_memory_used_max_gib": max(used) / 2**30 if used else None,
                "process_allocated_max_gib": max(held) / 2**30 if held else None,
                "samples": len(util)}


def drive(url: str, model: str, clients: list[int], window: str, work: Path,
          ) -> list[dict[str, Any]]:
    """`turboinfer load --scenario concurrency` at each client count, /metrics beside."""
    rows = []
    for count in clients:
        report = work / f"load-{model}-{count}.json"
        with GpuScraper(url) as scraper:
            subprocess.run([sys.executable, "-m", "turboinfer", "load", url, "--model", model,
                            "--scenario", "concurrency", "--concurrency", str(count),
                            "--window", window, "--max-windows", "4", "--warmup", "1s",
                            "--min-requests", "1", "--quiet", "--output", str(report)],
                           check=True, stdout=subprocess.DEVNULL)
        level = json.loads(report.read_text())
        row = {"model": model, "clients": count, **summarise_load(level),
               **scraper.summary()}
        rows.append(row)
        util = row["gpu_utilisation_mean"]
        print(f"  serve {model:<20} {count:>3} clients: p50 {row['p50_ms']:8.3f} ms, "
              f"{row['requests_per_s']:9.1f} req/s, GPU busy "
              f"{'n/a' if util is None else f'{util:.0%}'}", flush=True)
    return rows


def summarise_load(report: dict[str, Any]) -> dict[str, Any]:
    """The (only) run of a one-level load report: p50, p99, throughput, failures."""
    run = report["runs"][-1]
    return {"p50_ms": run["latency"]["p50_ms"], "p99_ms": run["latency"]["p99_ms"],
            "requests_per_s": run["qps"], "failed": run["failed"],
            "stable": run["stable"], "valid": report["valid"]}


# --- the run ---------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true",
                        help="small: builtin:digits-cnn, batch 1 and 8, short windows")
    parser.add_argument("--compile", action="store_true",
                        help="also the torch.compile form (minutes of compiling on a GPU)")
    parser.add_argument("--model", default=None, help="default: builtin:resnet50")
    parser.add_argument("--clients", default=None, help="comma list (default 1,8,32)")
    parser.add_argument("--out", type=Path, default=Path("serve_acceptance.json"))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"error: --device cuda, but this torch ({torch.__version__}) sees no GPU; "
              "use --device cpu", file=sys.stderr)
        return 2
    started = time.perf_counter()
    model = resolve_model(args.model or ("builtin:digits-cnn" if args.quick
                                         else "builtin:resnet50"))
    batches = [1, 8] if args.quick else [1, 64]
    seconds = 0.5 if args.quick else 2.0
    clients = [int(c) for c in (args.clients or ("1,8" if args.quick else "1,8,32")
                                ).split(",")]
    machine = profile().summary()
    print(f"model {model.name} on {args.device}; {machine}", flush=True)
    result: dict[str, Any] = {"model": model.name, "device": args.device,
                              "torch": torch.__version__, "machine": machine,
                              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda"
                              else None}
    print("in process (host to host, after warm-up):", flush=True)
    result["engine"] = bench_engine(model, args.device, batches, seconds, args.compile)
    result["reference"] = bench_reference(model, args.device, batches, seconds)
    result["ratios"] = ratios(result["engine"], result["reference"])
    for line in result["ratios"]:
        print(f"  best engine form / reference, batch {line['batch_size']}: p50 "
              f"{line['p50_ratio']:.2f}x, throughput {line['throughput_ratio']:.2f}x "
              f"({line['form']})", flush=True)
    print("served (turboinfer serve + turboinfer load):", flush=True)
    with tempfile.TemporaryDirectory(prefix="serve-acceptance-") as tmp:
        work = Path(tmp)
        names = write_repo(work / "repo", model, args.device, max(batches),
                           cpu_baseline=not args.quick)
        with serving(work / "repo", work / "server.log") as url:
            served = []
            for name, engine in names.items():
                counts = clients if engine == "torch" else clients[-1:]
                served += drive(url, name, counts, "1s" if args.quick else "2s", work)
        result["served"] = served
    result["seconds"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out} after {result['seconds']} s", flush=True)
    return 0


def ratios(engine: list[dict[str, Any]], reference: list[dict[str, Any]]
           ) -> list[dict[str, Any]]:
    """Per batch size, the engine's fastest form against the reference."""
    out = []
    for ref in reference:
        rows = [r for r in engine if r["batch_size"] == ref["batch_size"]]
        best = min(rows, key=lambda r: r["p50_ms"])
        out.append({"batch_size": ref["batch_size"], "form": best["form"],
                    "p50_ratio": best["p50_ms"] / ref["p50_ms"],
                    "throughput_ratio": ref["mean_ms"] / best["mean_ms"]})
    return out


if __name__ == "__main__":
    sys.exit(main())
