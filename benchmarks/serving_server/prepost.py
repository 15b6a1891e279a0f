"""Pre-processing inside the server against clients that send ready tensors.

    python benchmarks/serving_server/prepost.py [--rounds 3] [--concurrency 32]

One ``turboinfer serve`` with no repository (the zoo's resnet18 and minilm, which take
JPEG bytes and strings beside their tensors), loaded with ``turboinfer load`` over HTTP
at ``--concurrency`` closed-loop clients, the two doors in alternating cells:

- ResNet-18 (seeded random weights) from JPEG files: 640x480 photo-like images (smooth
  noise and gradients, made here) that the server decodes, resizes (shorter side 256)
  and centre-crops to 224x224, against the same server fed the client's ready
  ``[1, 3, 224, 224]`` float32 tensor;
- MiniLM from a sentence the server tokenizes, against the client's token tensors of
  the same sentence; and the embeddings of both doors compared over the zoo's held-out
  sentences (cosine);
- PyTriton (nvidia-pytriton, its own venv at ``$PEERS_DIR/pytriton``, default
  ``/work/peers``) serving the same ResNet-18 export from the same JPEG files, its Python
  callable decoding, resizing and cropping them as the server does, then onnxruntime
  (``benchmarks/serving/peers/pytriton_jpeg.py``), in cells beside turboinfer's JPEG
  door; its logits are compared with turboinfer's on the 16 images first. Without the
  venv that side is skipped with a note. Create it with

      python -m venv /work/peers/pytriton && /work/peers/pytriton/bin/pip install \\
          nvidia-pytriton onnxruntime numpy pillow

Raw results go to ``prepost.json`` (or ``--output``); the load reports carry the server's
split of its time into pre-processing, queue, compute and post-processing.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

HERE = Path(__file__).resolve().parent
SRC = HERE.parent.parent / "src"
sys.path.insert(0, str(SRC))

from openloop import _spawn, _stop, pytriton_env, wait_ready  # noqa: E402  (beside this script)

from turboinfer.load.inputs import DATATYPES  # noqa: E402,F401  (the project on the path)

PEERS = Path(os.environ.get("PEERS_DIR", "/work/peers"))
PYTRITON_PORT = 18840  # and the next two: its gRPC and metrics ports
IMAGES = 16
SENTENCE = "A man is playing a guitar on a small stage in front of a quiet crowd."


def photo_like(width: int, height: int, seed: int) -> bytes:
    """Smooth colour noise (a coarse random grid upsampled), a gradient, fine grain."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, (6, 8, 3)).astype(np.uint8)
    smooth = np.asarray(Image.fromarray(coarse).resize((width, height),
                                                       Image.Resampling.BICUBIC), np.float32)
    ramp = np.linspace(-40, 40, width, dtype=np.float32)[None, :, None]
    pixels = smooth + ramp + rng.normal(0, 6, (height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def start_server(log: Path) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "turboinfer", "serve", "--zoo-models", "resnet18,minilm",
         "--http-port", "0", "--grpc-port", "0"], stdout=subprocess.PIPE,
        stderr=log.open("w"), text=True, env=dict(os.environ, PYTHONPATH=str(SRC)))
    assert process.stdout is not None
    line = process.stdout.readline()
    fields = dict(part.split("=", 1) for part in line.split()[2:])
    return process, int(fields["http"].rsplit(":", 1)[1])


def start_pytriton(work: Path) -> subprocess.Popen[bytes] | None:
    """PyTriton serving the zoo's ResNet-18 export from JPEG bytes; None without its venv."""
    python = PEERS / "pytriton" / "bin" / "python"
    if not python.exists():
        return None
    from turboinfer.models import resolve_model

    onnx = resolve_model("builtin:resnet18").artifact.onnx_path
    return _spawn([str(python), str(HERE.parent / "serving" / "peers" / "pytriton_jpeg.py"),
                   str(onnx), str(PYTRITON_PORT), "resnet18"], work / "pytriton.log",
                  pytriton_env())


def same_logits(ports: tuple[int, int], folder: Path) -> dict[str, float]:
    """Both servers' logits for every JPEG: top-1 agreement and largest difference."""
    import tritonclient.http as httpclient

    top1, worst = 0, 0.0
    files = sorted(folder.glob("*.jpg"))
    clients = [httpclient.InferenceServerClient(f"127.0.0.1:{port}") for port in ports]
    for file in files:
        logits = []
        for client, shape in zip(clients, ([1], [1, 1]), strict=True):
            image = httpclient.InferInput("image", shape, "BYTES")
            image.set_data_from_numpy(np.array([file.read_bytes()], dtype=object)
                                      .reshape(shape))
            logits.append(client.infer("resnet18", [image]).as_numpy("logits")[0])
        top1 += int(logits[0].argmax() == logits[1].argmax())
        worst = max(worst, float(np.abs(logits[0] - logits[1]).max()))
    for client in clients:
        client.close()
    return {"images": len(files), "top1_agreement": top1 / len(files),
            "max_abs_logit_difference": worst}


def load(port: int, model: str, data: Path, concurrency: int, out: Path) -> dict:
    command = [sys.executable, "-m", "turboinfer", "load", f"http://127.0.0.1:{port}",
               "--model", model, "--input-data", str(data), "--scenario", "concurrency",
               "--concurrency", str(concurrency), "--window", "2", "--max-windows", "3",
               "--stability", "1.0", "--warmup", "1", "--quiet", "--output", str(out)]
    subprocess.run(command, env=dict(os.environ, PYTHONPATH=str(SRC)), capture_output=True,
                   timeout=600, check=True)
    run = json.loads(out.read_text())["runs"][-1]
    server = run.get("server") or {}
    return {"qps": run["qps"], "p50_ms": run["latency"]["p50_ms"],
            "p99_ms": run["latency"]["p99_ms"], "failed": run["failed"],
            "server_ms": {k: server.get(f"{k}_ms") for k in
                          ("preprocess", "queue", "compute", "postprocess")},
            "avg_batch": server.get("avg_batch_size"),
            "load_average_1m": os.getloadavg()[0]}


def image_data(work: Path) -> tuple[Path, Path]:
    """A folder of JPEGs, and the client's ready tensor of the first (its own decode)."""
    from turboinfer.serve.images import ImageDecoder
    from turboinfer.serve.prepost_config import ImagePreprocess

    folder = work / "images"
    folder.mkdir()
    for seed in range(IMAGES):
        (folder / f"{seed:02d}.jpg").write_bytes(photo_like(640, 480, seed))
    tensor = np.empty((1, 3, 224, 224), np.float32)
    ImageDecoder(ImagePreprocess(kind="image"), np.dtype(np.float32)).fill(
        "image", (folder / "00.jpg").read_bytes(), tensor[0])
    np.savez(work / "image-tensor.npz", input=tensor)
    return folder, work / "image-tensor.npz"


def text_data(work: Path) -> tuple[Path, Path]:
    from turboinfer.models.minilm import tokenize

    lines = work / "sentence.txt"
    lines.write_text(SENTENCE + "\n")
    np.savez(work / "text-tensors.npz", **tokenize([SENTENCE]))
    return lines, work / "text-tensors.npz"


def cosines(port: int) -> dict[str, float]:
    """Embeddings from strings vs from the client's token tensors, held-out sentences."""
    import tritonclient.http as httpclient

    from turboinfer.models.minilm import evaluation_sentences, tokenize

    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    values = []
    for sentence in evaluation_sentences():
        text = httpclient.InferInput("text", [1], "BYTES")
        text.set_data_from_numpy(np.array([sentence.encode()], dtype=object))
        got = client.infer("minilm", [text]).as_numpy("embeddings")[0]
        inputs = []
        for name, value in tokenize([sentence]).items():
            tensor = httpclient.InferInput(name, list(value.shape), "INT64")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        want = client.infer("minilm", inputs).as_numpy("embeddings")[0]
        values.append(float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)))
    client.close()
    return {"sentences": len(values), "min": min(values), "mean": float(np.mean(values))}


def summary(cells: dict[str, list[dict]], raw: str, tensor: str) -> dict[str, float]:
    best = {label: max(c["qps"] for c in cells[label]) for label in (raw, tensor)}
    median = {label: float(np.median([c["qps"] for c in cells[label]]))
              for label in (raw, tensor)}
    return {f"{raw}_qps_best": best[raw], f"{tensor}_qps_best": best[tensor],
            "ratio_best": best[raw] / best[tensor],
            "ratio_median": median[raw] / median[tensor]}


def per_cell(cells: dict[str, list[dict]], label: str, peer: str) -> dict:
    """``label`` over ``peer``, cell by cell (the cells of one round side by side)."""
    ours = [c["qps"] for c in cells[label]]
    theirs = [c["qps"] for c in cells[peer]]
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    return {f"{label}_qps": ours, f"{peer}_qps": theirs, "ratio_per_round": ratios,
            "ratio_median": float(np.median(ours)) / float(np.median(theirs)),
            "ratio_best": max(ours) / max(theirs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--no-pytriton", action="store_true",
                        help="leave PyTriton out even when its venv exists")
    parser.add_argument("--output", default="prepost.json",
                        help="file beside this script the results go to")
    args = parser.parse_args()
    cells: dict[str, list[dict]] = {}
    from turboinfer.hardware import profile

    cpu = profile(engines=False, gpus=False).cpu
    result: dict = {"cpu": cpu.model_name, "isa": sorted(cpu.features),
                    "cores": os.cpu_count(), "concurrency": args.concurrency,
                    "load_average_1m_before": os.getloadavg()[0], "cells": cells}
    with tempfile.TemporaryDirectory(prefix="prepost-") as tmp:
        work = Path(tmp)
        images, image_tensor = image_data(work)
        sentence, text_tensors = text_data(work)
        process, port = start_server(work / "server.log")
        peer = start_pytriton(work) if not args.no_pytriton else None
        try:
            result["minilm_cosine"] = cosines(port)
            plan = [("resnet18_jpeg", port, "resnet18", images),
                    ("resnet18_tensor", port, "resnet18", image_tensor),
                    ("minilm_strings", port, "minilm", sentence),
                    ("minilm_tensors", port, "minilm", text_tensors)]
            if peer is None:
                result["pytriton"] = ("skipped: --no-pytriton" if args.no_pytriton else
                                      f"skipped: no venv at {PEERS / 'pytriton'}")
            else:
                try:
                    wait_ready(PYTRITON_PORT, peer, model="resnet18")
                except RuntimeError as exc:
                    log = (work / "pytriton.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"PyTriton did not start ({exc}):\n{log}") from None
                result["pytriton_logits"] = same_logits((port, PYTRITON_PORT), images)
                print("pytriton_logits", json.dumps(result["pytriton_logits"]), flush=True)
                plan.insert(1, ("pytriton_jpeg", PYTRITON_PORT, "resnet18", images))
            for round_index in range(args.rounds):
                order = plan if round_index % 2 == 0 else plan[::-1]
                for label, server, model, data in order:
                    cell = load(server, model, data, args.concurrency, work / f"{label}.json")
                    cells.setdefault(label, []).append(cell)
                    print(label, json.dumps(cell), flush=True)
        finally:
            process.terminate()
            process.wait(30)
            if peer is not None:
                _stop(peer)
    result["resnet18"] = summary(cells, "resnet18_jpeg", "resnet18_tensor")
    result["minilm"] = summary(cells, "minilm_strings", "minilm_tensors")
    if "pytriton_jpeg" in cells:
        result["pytriton"] = per_cell(cells, "resnet18_jpeg", "pytriton_jpeg")
    result["load_average_1m_after"] = os.getloadavg()[0]
    (HERE / args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("resnet18", "minilm", "minilm_cosine",
                                             "pytriton")}, indent=2))


if __name__ == "__main__":
    main()
