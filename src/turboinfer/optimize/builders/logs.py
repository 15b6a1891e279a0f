"""Silencing the libraries the optimizer drives.

ORT's quantizers and transformer optimizer print progress to stdout and log warnings
through the root logger; stdout belongs to ``--json`` output, and their warnings (shape
inference fallbacks, pre-processing hints) are not actionable for a user of turboinfer.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import tempfile
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


@contextlib.contextmanager
def scratch_cwd() -> Iterator[None]:
    """Run inside a throw-away working directory.

    ORT's symbolic shape inference saves ``sym_shape_infer_temp.onnx`` and its external
    data into the current directory when it gives up, leaving ~100 MB files wherever the
    user happened to run turboinfer. Callers must pass absolute paths.
    """
    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="turboinfer-") as scratch:
        os.chdir(scratch)
        try:
            yield
        finally:
            os.chdir(previous)
