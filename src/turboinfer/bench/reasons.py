"""Why an engine was skipped, as one readable line.

Engine libraries put C++ source locations, assertion text and line breaks in their
messages; a skip reason keeps what names the model part (the node, the shapes) and drops
the rest, so the table stays one line per skip.
"""

from __future__ import annotations

import re

from turboinfer.errors import TurboinferError

# The longest reason shown; a library's message past it is cut, not the line wrapped.
MAX_REASON = 400

_NOISE = (
    re.compile(r"Exception from \S+:\d+:\s*"),  # OpenVINO: where it was thrown
    re.compile(r"Check '.*?' failed at \S+:\d+:\s*"),  # OpenVINO: the failed assertion
    re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : "),  # ONNX Runtime: the status code
    re.compile(r"/\S+\.(?:h|cc|cpp):\d+ \S+\([^)]*\)\s*"),  # ONNX Runtime: file and function
)


def one_line(exc: BaseException) -> str:
    """The exception as one line without library noise; non-domain errors keep their type."""
    text = str(exc)
    for pattern in _NOISE:
        text = pattern.sub("", text)
    text = " ".join(text.split())
    if not isinstance(exc, TurboinferError):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."


def pinned_axis_hint(batch_size: int, ran: list[int]) -> str:
    """What to try when a smaller batch ran and this one did not: the graph fixes the
    batch axis somewhere inside, which only a re-export changes."""
    if not ran or batch_size <= min(ran):
        return ""
    return (f" (batch size {min(ran)} ran, so the graph fixes the batch axis: export it with "
            f"a dynamic batch axis, or leave batch size {batch_size} out)")
