"""Small real models for the pre/post-processing tests: an image classifier over NCHW
float input and a token model whose per-token output is an embedding lookup, with a
WordLevel tokenizer saved in the tokenizers library's own format."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = ("the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "quick", "brown")
HIDDEN = 8
CLASSES = 4


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def image_classifier(path: Path) -> Path:
    """``input [N, 3, H, W]`` -> ``logits [N, 4]``: channel means times a fixed matrix."""
    weight = np.array([[1, 0, 0, 1], [0, 1, 0, -1], [0, 0, 1, 0.5]], np.float32)
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
         helper.make_node("Flatten", ["pooled"], ["flat"]),
         helper.make_node("MatMul", ["flat", "w"], ["logits"])],
        "image",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", CLASSES])],
        initializer=[numpy_helper.from_array(weight, "w")])
    return _save(graph, path)


def token_model(path: Path) -> Path:
    """``input_ids, attention_mask [N, S]`` -> ``hidden [N, S, 8]``: an embedding table
    row per token, zeroed where the mask is 0."""
    # Rows past the vocabulary: random timing inputs draw ids below 100 (bench.inputs).
    table = np.random.default_rng(3).standard_normal((128, HIDDEN)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "input_ids"], ["rows"]),
         helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
         helper.make_node("Unsqueeze", ["maskf", "axis"], ["mask3"]),
         helper.make_node("Mul", ["rows", "mask3"], ["hidden"])],
        "tokens",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        initializer=[numpy_helper.from_array(table, "table"),
                     numpy_helper.from_array(np.array([2], np.int64), "axis")])
    return _save(graph, path)


def tokenizer(path: Path, max_length: int = 6) -> Path:
    vocab = {"[PAD]": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.enable_truncation(max_length)
    tok.save(str(path))
    return path


def photo(width: int = 96, height: int = 64, seed: int = 0, fmt: str = "JPEG") -> bytes:
    """A smooth, photo-like image (gradients and a little noise), encoded."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    channels = [128 + 90 * np.sin(x / (9 + 3 * c) + seed) * np.cos(y / 11) for c in range(3)]
    pixels = np.stack(channels, -1) + rng.normal(0, 4, (height, width, 3))
    buffer = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buffer, fmt)
    return buffer.getvalue()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` (the pixel data is not there)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b""))
