"""Structured output on the demo model: JSON following a schema with nested objects,
arrays and enums in every sampled answer at temperature 1, a regex, a JSON object, and
malformed constraints refused with the field named."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
import torch

from turboinfer.errors import InvalidInputError
from turboinfer.llm import LLM, SamplingParams
from turboinfer.llm.engine.structured import StructuredOutput

pytest.importorskip("llguidance")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "inner": {"type": "object",
                  "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 1000},
                                 "ok": {"type": "boolean"}},
                  "required": ["n", "ok"], "additionalProperties": False},
    },
    "required": ["name", "tags", "inner"], "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM()


def test_every_sampled_answer_follows_the_schema(llm: LLM) -> None:
    so = StructuredOutput.json_schema(SCHEMA)
    params = [SamplingParams(max_tokens=120, temperature=1.0, seed=i, structured=so)
              for i in range(50)]
    outputs = llm.generate(["Return the config as JSON: "] * 50, params)
    for out in outputs:
        jsonschema.validate(json.loads(out.text), SCHEMA)
        assert out.finish_reason == "stop"
    assert len({o.text for o in outputs}) > 10  # sampled, not one forced answer


def test_a_regex_and_a_json_object(llm: LLM) -> None:
    regex = StructuredOutput("regex", r"[0-9]{3}-[a-z]{2,4}")
    out = llm.generate(["The code is "] * 5, [SamplingParams(max_tokens=20, seed=i,
                                                             structured=regex)
                                              for i in range(5)])
    assert all(re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", o.text) for o in out), [o.text for o in out]
    obj = llm.generate("Data: ", SamplingParams(max_tokens=200, temperature=0,
                                                structured=StructuredOutput("json_object")))
    if obj[0].finish_reason == "stop":
        assert isinstance(json.loads(obj[0].text), dict)
    else:  # an unbounded object may run out of tokens; what there is is a JSON prefix
        assert obj[0].text.startswith("{")


def test_unconstrained_requests_beside_constrained_ones_are_unchanged(llm: LLM) -> None:
    plain = SamplingParams(max_tokens=16, temperature=0)
    alone = llm.generate("The module", plain)[0].token_ids
    mixed = llm.generate(["The module", "Return the config as JSON: "], [
        plain, SamplingParams(max_tokens=40, temperature=0,
                              structured=StructuredOutput.json_schema(SCHEMA))])
    assert mixed[0].token_ids == alone


@pytest.mark.parametrize("structured", [
    StructuredOutput("json_schema", "{not json"),
    StructuredOutput("json_schema", json.dumps({"type": "nonsense"})),
    StructuredOutput("regex", "[unclosed"),
    StructuredOutput("grammar", "start: ???"),
])
def test_malformed_constraints_are_refused(llm: LLM, structured: StructuredOutput) -> None:
    with pytest.raises(InvalidInputError) as info:
        llm.generate("x", SamplingParams(max_tokens=4, structured=structured))
    assert info.value.param == "response_format" and "\n" not in str(info.value)


@pytest.mark.parametrize("vocab", [32000, 49155])
def test_masks_apply_the_same_in_c_and_in_numpy(monkeypatch: pytest.MonkeyPatch,
                                                vocab: int) -> None:
    from turboinfer.llm.backends.cpu.native import native_status
    from turboinfer.llm.engine import structured

    if native_status().library is None:
        pytest.skip(f"native library absent: {native_status().reason}")
    rng = np.random.default_rng(0)
    words = (vocab + 31) // 32
    masks = rng.integers(-2**31, 2**31, size=(3, words), dtype=np.int64).astype(np.int32)
    masks[0, :] = -1          # everything allowed
    masks[1, 5:] = 0          # a few tokens allowed
    logits = torch.randn(5, vocab)
    rows = [4, 0, 2]
    native = logits.clone()
    structured.apply_masks(native, rows, masks)
    monkeypatch.setattr(structured, "_native", lambda: None)
    fallback = logits.clone()
    structured.apply_masks(fallback, rows, masks)
    assert torch.equal(native, fallback)
    assert torch.equal(native[[1, 3]], logits[[1, 3]])          # rows not named stay
    bits = np.unpackbits(masks.view(np.uint8), axis=1, bitorder="little")[:, :vocab]
    assert int(torch.isinf(native[0]).sum()) == int((bits[1] == 0).sum())
