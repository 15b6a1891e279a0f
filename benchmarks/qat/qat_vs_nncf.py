"""QAT against post-training INT8 and against NNCF's QAT, side by side on digits-dsconv.

    python benchmarks/qat/qat_vs_nncf.py [--epochs 10] [--out benchmarks/qat/qat_vs_nncf.json]

digits-dsconv is the zoo's depthwise-separable CNN whose channel ranges are spread (same
function): every post-training calibration loses points on it. Three ways to INT8, each
judged on the 450 held-out digits:

- PTQ: ONNX Runtime's static QDQ quantizer (the one ``optimize``/``tune`` use), per-channel
  weights, with MinMax, Entropy and Percentile calibration.
- turboinfer QAT (``turboinfer.qat``): fine-tuned with fake quantization, then quantized by
  that same ONNX Runtime quantizer with MinMax ranges, run in ONNX Runtime.
- NNCF QAT: ``nncf.quantize`` on the torch model (its default 8-bit scheme), fine-tuned
  by the same loop (same loss, optimizer, learning rate, batches and epochs, BatchNorm
  frozen), converted with ``openvino.convert_model`` and run by OpenVINO on the CPU,
  NNCF's own deployment path.
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch

from turboinfer.hardware import profile
from turboinfer.models import digits
from turboinfer.models.export import export_onnx
from turboinfer.models.zoo import get_entry
from turboinfer.prune.data import TrainData
from turboinfer.prune.distill import distill
from turboinfer.prune.settings import DistillSettings
from turboinfer.qat.train import QATSettings, qat_finetune

CALIBRATIONS = ("minmax", "entropy", "percentile")


def ort_int8(model: torch.nn.Module, folder: Path, methods: tuple[str, ...]) -> dict[str, float]:
    """Held-out accuracy of FP32 and of each INT8 calibration, as ``optimize`` builds and
    judges them (prepared graph, QDQ, per-channel weights) in ONNX Runtime."""
    from turboinfer.optimize import optimize

    split = digits.data()
    calib, held = folder / "calib.npz", folder / "eval.npz"
    np.savez(calib, input=digits.calibration(500)["input"])
    np.savez(held, input=split.test_x, labels=split.test_y)
    path = export_onnx(model, {"input": split.test_x[:2]}, folder / "model.onnx",
                       input_names=["input"], output_names=["logits"],
                       dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    report = optimize(path, folder / "out", variants=["int8-static"], calibrations=methods,
                      calib_data=calib, eval_data=held)
    return {v.name: float(v.metric) for v in report.variants if v.metric is not None}


def nncf_qat(model: torch.nn.Module, data: TrainData, epochs: int,
             lr: float) -> tuple[float, str]:
    # NNCF compiles its fake-quantize kernels on first use; on a busy two-core machine
    # that takes longer than its default 60 s limit.
    os.environ.setdefault("NNCF_EXTENSION_LOAD_TIMEOUT", "0")
    import nncf
    import openvino as ov

    split = digits.data()
    calib = [torch.from_numpy(split.train_x[i : i + 64]) for i in range(0, 512, 64)]
    quantized = nncf.quantize(copy.deepcopy(model).eval(), nncf.Dataset(calib))
    distill(quantized, copy.deepcopy(model).eval(), data,
            DistillSettings(epochs=epochs, lr=lr, weight_decay=0.0), freeze_norms=True)
    quantized.eval()
    try:
        compiled = ov.compile_model(
            ov.convert_model(quantized, example_input=torch.from_numpy(split.test_x[:2])), "CPU")
        logits = compiled(split.test_x)[0]
        where = "openvino"
    except RuntimeError as exc:
        # OpenVINO's CPU plugin refused this graph once ("No suitable implementations"):
        # then NNCF's own fake-quantized torch model is what is judged.
        with torch.no_grad():
            logits = quantized(torch.from_numpy(split.test_x)).numpy()
        where = f"nncf fake-quant in torch (openvino: {str(exc).strip().splitlines()[-1][:80]})"
    return float((logits.argmax(-1) == split.test_y).mean() * 100), where


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=QATSettings.lr)
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).with_name("qat_vs_nncf.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = get_entry("digits-dsconv").build()
    split = digits.data()
    data = TrainData({"input": split.train_x}, split.train_y, batch_size=64)
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ptq = ort_int8(model, Path(tmp), CALIBRATIONS)
    rows["fp32"] = {"accuracy": ptq["fp32"]}
    for method in CALIBRATIONS:
        rows[f"ptq-{method}"] = {"accuracy": ptq[f"int8-static-{method}"]}
    started = time.perf_counter()
    result = qat_finetune(model, data, QATSettings(epochs=args.epochs, lr=args.lr))
    seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        qat = ort_int8(result.model, Path(tmp), ("minmax",))
    rows["turboinfer-qat"] = {"accuracy": qat["int8-static-minmax"], "train_seconds": seconds,
                              "epochs": args.epochs, "lr": args.lr}
    started = time.perf_counter()
    accuracy, where = nncf_qat(model, data, args.epochs, args.lr)
    rows["nncf-qat"] = {"accuracy": accuracy, "run_by": where,
                        "train_seconds": time.perf_counter() - started,
                        "epochs": args.epochs, "lr": args.lr}
    for row in rows.values():
        row["drop"] = rows["fp32"]["accuracy"] - row["accuracy"]
    report = {"model": "builtin:digits-dsconv", "rows": rows,
              "machine": dict(profile(engines=False, gpus=False).summary()),
              "load_average": os.getloadavg()}
    args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    for name, row in rows.items():
        print(f"{name:<16} accuracy {row['accuracy']:6.2f}  drop {row['drop']:5.2f}")


if __name__ == "__main__":
    main()
