"""Infer requests in the Open Inference Protocol, encoded once and sent many times.

Encoding is the client's most expensive step per request (JSON of a 150k-element image
is milliseconds), so a load test encodes its inputs once here and the hot path only
writes the same bytes again; what the server does with them is all that is measured.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from turboinfer.load.inputs import ModelInfo

BINARY_CONTENT_TYPE = "application/octet-stream"
JSON_CONTENT_TYPE = "application/json"


@dataclass(frozen=True)
class HttpPayload:
    """The body and headers of one ``POST .../infer``."""

    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]


def infer_path(model: str, version: str = "") -> str:
    versioned = f"/versions/{version}" if version else ""
    return f"/v2/models/{model}{versioned}/infer"


def encode_http(info: ModelInfo, tensors: Mapping[str, np.ndarray], *, binary: bool,
                version: str = "") -> HttpPayload:
    """A JSON request, or the binary tensor data extension (header JSON + raw bytes)."""
    path = infer_path(info.name, version)
    if not binary:
        doc = {"inputs": [_json_tensor(info, name, array) for name, array in tensors.items()]}
        body = orjson.dumps(doc)
        return HttpPayload(path, body, (("Content-Type", JSON_CONTENT_TYPE),))
    header_inputs, blobs = [], []
    for name, array in tensors.items():
        blob = tensor_bytes(array, input_datatype(info, name))
        blobs.append(blob)
        header_inputs.append({
            "name": name,
            "shape": list(array.shape),
            "datatype": input_datatype(info, name),
            "parameters": {"binary_data_size": len(blob)},
        })
    header = orjson.dumps({"inputs": header_inputs,
                           "parameters": {"binary_data_output": True}})
    return HttpPayload(path, header + b"".join(blobs), (
        ("Content-Type", BINARY_CONTENT_TYPE),
        ("Inference-Header-Content-Length", str(len(header))),
    ))


def input_datatype(info: ModelInfo, name: str) -> str:
    """The datatype the model declares for input ``name``."""
    return next(spec.datatype for spec in info.inputs if spec.name == name)


def _json_tensor(info: ModelInfo, name: str, array: np.ndarray) -> dict[str, Any]:
    datatype = input_datatype(info, name)
    if datatype == "BYTES":
        data: list[Any] = [_text(v) for v in array.reshape(-1)]
    else:
        data = array.reshape(-1).tolist()
    return {"name": name, "shape": list(array.shape), "datatype": datatype, "data": data}


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def tensor_bytes(array: np.ndarray, datatype: str) -> bytes:
    """Raw little-endian bytes; BYTES elements each get a 4-byte length prefix."""
    if datatype != "BYTES":
        return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
    parts = []
    for value in array.reshape(-1):
        raw = value if isinstance(value, bytes) else str(value).encode()
        parts.append(struct.pack("<I", len(raw)) + raw)
    return b"".join(parts)
