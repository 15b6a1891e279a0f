"""Silencing the libraries the optimizer drives.

ORT's quantizers and transformer optimizer print progress to stdout and log warnings
through the root logger; stdout belongs to ``--json`` output, and their warnings (shape
inference fallbacks, pre-processing hints) are not actionable for a user of turboinfer.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)
