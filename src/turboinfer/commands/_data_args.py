"""The data flags ``optimize`` and ``tune`` share: calibration (arrays, images or
synthetic) and evaluation (labelled arrays or the user's metric function)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from turboinfer.commands._args import comma_list, positive_int

# ImagePrep's defaults, repeated: importing turboinfer.optimize is too slow for --help.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
METRICS = ("top1", "cosine", "f1", "mae")


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    calib = parser.add_argument_group("calibration data")
    calib.add_argument("--calib-data", type=Path,
                       help=".npz (one array per input name) or a folder of NAME.npy")
    calib.add_argument("--calib-images", type=Path, metavar="DIR",
                       help="a folder of images for a model with one NCHW RGB input")
    calib.add_argument("--resize", type=positive_int, default=256,
                       help="--calib-images: shorter side resized to this")
    calib.add_argument("--crop", type=positive_int,
                       help="--calib-images: centre crop (default: the model's input size)")
    calib.add_argument("--mean", type=comma_list(float), default=MEAN,
                       help="--calib-images: per-channel mean of [0, 1] pixels (R,G,B)")
    calib.add_argument("--std", type=comma_list(float), default=STD,
                       help="--calib-images: per-channel standard deviation (R,G,B)")
    calib.add_argument("--calib-text", type=Path, metavar="FILE",
                       help="text lines for a text model, tokenized with its folder's "
                            "tokenizer.json (a slice is held out for the fidelity check)")
    calib.add_argument("--tokenizer", type=Path, metavar="FILE",
                       help="--calib-text: the tokenizer.json (default: the model folder's)")
    calib.add_argument("--synthetic-calib", "--random-calibration", dest="synthetic_calib",
                       action="store_true",
                       help="calibrate (and check fidelity) on inputs drawn from the input "
                            "specs; real data is better")
    evaluation = parser.add_argument_group("evaluation data")
    evaluation.add_argument("--eval-data", metavar="SOURCE",
                            help=".npz or folder of .npy (inputs by name plus labels), or "
                                 "package.module:function returning the metric; without it "
                                 "a budget is checked as fidelity to FP32 on held-out "
                                 "calibration samples")
    evaluation.add_argument("--metric", choices=METRICS,
                            help="metric over the labels (default: inferred from the labels "
                                 "and the output)")
    qat = parser.add_argument_group("quantization-aware training (--variants ...,qat)")
    qat.add_argument("--train-data", type=Path, metavar="PATH",
                     help=".npz or folder of .npy (inputs by name, plus labels for a "
                          "supervised loss); default: a built-in's training split, else the "
                          "calibration samples distilled from the float model")
    qat.add_argument("--qat-epochs", type=positive_int, default=None,
                     help="passes over the training data (default: 10)")
    qat.add_argument("--qat-minutes", type=float, default=None, metavar="M",
                     help="time budget of QAT's training: it stops when M minutes are spent")


def data_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """The API keywords of the data flags."""
    # Here, not at the top: turboinfer.optimize loads onnx and onnxruntime (slow --help).
    from turboinfer.optimize.settings import ImagePrep

    prep = ImagePrep(resize=args.resize, crop=args.crop, mean=tuple(args.mean),
                     std=tuple(args.std))
    return {"calib_data": args.calib_data, "calib_images": args.calib_images,
            "calib_text": args.calib_text, "tokenizer": _tokenizer(args),
            "image_prep": prep, "synthetic_calib": args.synthetic_calib or None,
            "eval_data": args.eval_data, "metric": args.metric,
            "train_data": args.train_data, "qat_epochs": args.qat_epochs,
            "qat_minutes": args.qat_minutes}


def _tokenizer(args: argparse.Namespace) -> Path | None:
    """``--tokenizer``, else the model folder's tokenizer.json when text calibrates."""
    if args.tokenizer is not None or args.calib_text is None:
        return args.tokenizer
    folder = Path(getattr(args, "model", "") or ".")
    return folder / "tokenizer.json" if folder.is_dir() else None
