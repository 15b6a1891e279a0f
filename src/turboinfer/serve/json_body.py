"""Parsing a request's JSON document with a peak memory close to the body's own size.

orjson builds its whole parse tree before making Python objects, so on a large body of
float tensor data its peak is many times the body. msgspec makes the Python objects as
it reads, peaking near the body's size (tests/serve/test_body_limits.py bounds it);
below ``LARGE_JSON_BYTES``
orjson is kept, as the two are alike there and it serves every other JSON path.

orjson refuses documents nested deeper than 1024 levels; msgspec recurses until Python's
recursion limit, which is caught here so that a deep body is a 400 like any other.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from turboinfer.errors import InvalidInputError

LARGE_JSON_BYTES = 64 * 1024
_decode = msgspec.json.decode


def parse_json(data: bytes | memoryview) -> Any:
    """The JSON document in ``data``; malformed JSON is an ``InvalidInputError``."""
    try:
        if len(data) < LARGE_JSON_BYTES:
            return orjson.loads(data)
        return _decode(data)
    except (orjson.JSONDecodeError, msgspec.DecodeError) as exc:
        raise InvalidInputError(f"malformed JSON in request body: {exc}") from None
    except RecursionError:
        raise InvalidInputError("malformed JSON in request body: nested too deeply") from None


def parse_json_object(data: bytes) -> dict[str, Any]:
    """An optional JSON object body (a control-plane request): empty is ``{}``."""
    if not data.strip():
        return {}
    doc = parse_json(data)
    if not isinstance(doc, dict):
        raise InvalidInputError("the request body must be a JSON object")
    return doc
