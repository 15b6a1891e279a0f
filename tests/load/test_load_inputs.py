from pathlib import Path

import numpy as np
import orjson
import pytest

from turboinfer.errors import InvalidInputError
from turboinfer.load.inputs import ModelInfo, TensorInfo, load_inputs, parse_metadata, random_inputs
from turboinfer.load.protocol import encode_http

INFO = ModelInfo("m", "1", (TensorInfo("ids", "INT64", (-1, 8)),
                            TensorInfo("text", "BYTES", (-1,))), ())


def test_metadata_parses_and_rejects_unknown_datatypes() -> None:
    doc = {"name": "m", "versions": ["1", "2"],
           "inputs": [{"name": "x", "datatype": "fp32", "shape": [-1, 3]}], "outputs": []}
    info = parse_metadata(doc)
    assert info.version == "2" and info.inputs[0] == TensorInfo("x", "FP32", (-1, 3))
    doc["inputs"][0]["datatype"] = "COMPLEX64"  # type: ignore[index]
    with pytest.raises(InvalidInputError, match="COMPLEX64"):
        parse_metadata(doc)


def test_random_inputs_follow_metadata() -> None:
    tensors = random_inputs(INFO, batch_size=3, seed=1)
    assert tensors["ids"].shape == (3, 8) and tensors["ids"].dtype == np.int64
    assert tensors["text"].shape == (3,) and isinstance(tensors["text"][0], bytes)
    again = random_inputs(INFO, batch_size=3, seed=1)
    assert np.array_equal(tensors["ids"], again["ids"])


def test_dynamic_inner_axis_needs_a_shape() -> None:
    info = ModelInfo("m", "1", (TensorInfo("x", "FP32", (-1, -1)),), ())
    with pytest.raises(InvalidInputError, match="--shape x="):
        random_inputs(info)
    assert random_inputs(info, batch_size=2, shapes={"x": (5,)})["x"].shape == (2, 5)


def test_input_file_of_wrong_shape_is_named(tmp_path: Path) -> None:
    path = tmp_path / "in.npz"
    np.savez(path, ids=np.zeros((2, 7), np.int64), text=np.array([b"a", b"b"]))
    with pytest.raises(InvalidInputError, match=r"'ids' has shape \[2, 7\]"):
        load_inputs(path, INFO)
    np.savez(path, ids=np.zeros((2, 8), np.int32), text=np.array([b"a", b"b"]))
    assert load_inputs(path, INFO)["ids"].dtype == np.int64


def test_input_file_missing_or_extra_or_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "in.npz"
    np.savez(path, ids=np.zeros((2, 8), np.int64))
    with pytest.raises(InvalidInputError, match="missing input 'text'"):
        load_inputs(path, INFO)
    np.savez(path, ids=np.zeros((2, 8)), text=np.array([b"a"]), other=np.zeros(1))
    with pytest.raises(InvalidInputError, match="'other' is not an input"):
        load_inputs(path, INFO)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(InvalidInputError, match="cannot read"):
        load_inputs(tmp_path / "bad.npz", INFO)


def test_binary_and_json_encodings() -> None:
    tensors = {"ids": np.arange(8, dtype=np.int64).reshape(1, 8),
               "text": np.array([b"hey"], dtype=object)}
    binary = encode_http(INFO, tensors, binary=True)
    length = int(dict(binary.headers)["Inference-Header-Content-Length"])
    header = orjson.loads(binary.body[:length])
    assert header["inputs"][0]["parameters"]["binary_data_size"] == 64
    assert binary.body[length:length + 64] == tensors["ids"].tobytes()
    assert binary.body[length + 64:] == b"\x03\x00\x00\x00hey"
    doc = orjson.loads(encode_http(INFO, tensors, binary=False).body)
    assert doc["inputs"][0]["data"] == list(range(8)) and doc["inputs"][1]["data"] == ["hey"]


def test_a_model_without_declared_inputs_is_refused() -> None:
    from turboinfer.load.session import LoadSettings, _tensors

    with pytest.raises(InvalidInputError, match="declares no inputs"):
        _tensors(ModelInfo("m", "1", (), ()), LoadSettings(url="http://x", model="m"))
