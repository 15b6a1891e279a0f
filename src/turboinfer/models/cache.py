"""Where built models, trained weights and reference outputs are kept between runs.

Everything here is a pure function of its key, so a stale or broken file is simply
rebuilt; files appear atomically so that a crash or a concurrent run never leaves half a
file behind under the final name.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from turboinfer.cache_folder import cache_folder


def cache_dir() -> Path:
    """``$TURBOINFER_CACHE_DIR`` if set, else the user cache folder; created on demand."""
    return cache_folder(create=True)


@contextlib.contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; rename it to ``final`` if the block succeeds.

    The temporary name is unique per call so two processes building the same file do not
    write into each other's file; the last rename wins and both results are identical.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
