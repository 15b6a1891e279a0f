"""Kernel (and thread-count) choices remembered across processes, per machine.

Timing every linear shape's candidates is most of an engine's start (the demo model: 3.9
of its 4.0 s; SmolLM2-135M's GGUF file: 1.6 of 2.3 s), and it would find the same
winners again on the same machine. So each choice is also written to a file in the cache
folder (``$TURBOINFER_CACHE_DIR/kernels``, else the user cache folder) named after what
the timings depend on: the CPU (model, flags, caches, the cores this process may use),
torch's version, the compiled native library (its name hashes its sources, flags,
compiler and CPU) and the Python sources that build and time the kernels and the thread
count. Inside, a kernel choice is keyed as ``kernels._decide`` keys it in memory (format,
shape, bias, row count, group size, thread count and the candidates offered), a thread
count by its probe's shape and the usable cores (``threads.choose_threads``). Another
machine, another library or a changed kernel finds no file and measures.

``$TURBOINFER_KERNEL_CACHE``: ``on`` (the default) reads and writes the file; ``refresh``
measures every shape again and overwrites what was there (a choice timed while the
machine was busy); ``off`` neither reads nor writes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import torch

from turboinfer.cache_folder import cache_folder
from turboinfer.hardware.cpu import read_cpu
from turboinfer.llm.backends.cpu.native import native_status

MODE_ENV = "TURBOINFER_KERNEL_CACHE"
MODES = ("on", "refresh", "off")
# The Python that builds and times the kernels: a change to any of them measures again.
_SOURCES = ("kernels.py", "kernel_candidates.py", "threads.py", "../../model/quant.py")


def mode() -> str:
    """The cache's mode from the environment; an unknown value is ``on``."""
    value = os.environ.get(MODE_ENV, "on").strip().lower()
    return value if value in MODES else "on"


def load(key: str) -> dict[str, Any] | None:
    """The stored choice for ``key``, or None (none stored, or the mode reads nothing)."""
    if mode() != "on":
        return None
    entry = _read(_path()).get(key)
    return entry if isinstance(entry, dict) else None


def store(key: str, choice: dict[str, Any]) -> None:
    """Add ``choice`` under ``key`` (unless the mode is ``off``). The file is read again
    and replaced whole, so a process writing at the same time loses at most its own
    latest choices, and no reader ever sees half a file."""
    if mode() == "off":
        return
    path = _path()
    entries = _read(path)
    entries[key] = choice
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(entries, indent=0, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError:
        pass            # a read-only cache folder: the choice is kept in memory only
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _read(path: Path) -> dict[str, Any]:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}       # none yet, or a damaged file: measured again and rewritten
    return entries if isinstance(entries, dict) else {}


def _path() -> Path:
    return cache_folder("kernels") / f"{machine_key()}.json"


def machine_key() -> str:
    """A hash of everything the choices depend on besides their own key."""
    library = native_status().library
    return _machine_key(library.path.name if library is not None else "no library")


@functools.cache
def _machine_key(library: str) -> str:
    cpu = read_cpu()
    here = Path(__file__).parent
    parts = [cpu.model_name, " ".join(cpu.flags), repr(cpu.caches), str(cpu.usable_cores),
             torch.__version__, library, *((here / name).read_text() for name in _SOURCES)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
