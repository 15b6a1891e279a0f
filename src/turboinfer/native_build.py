"""Compile C sources into a shared library once per source, compiler, flags and CPU.

The library is kept in a cache folder under a name that hashes everything its machine
code depends on: the sources, the flags, the compiler's ``--version`` and the CPU's
feature flags (``-march=native`` compiles for this CPU). It is written under a unique
temporary name and renamed into place, so processes compiling at the same time never
load half a file. Used by the LLM kernels and the server's image resize.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path

from turboinfer.cache_folder import ENV_VAR, cache_folder

COMPILE_TIMEOUT_S = 120
CACHE_ENV = ENV_VAR     # the cache folder: part of a loaded library's key


def native_folder() -> Path:
    """Where compiled libraries are kept: ``native`` in the project's cache folder."""
    return cache_folder("native")


def cpu_flags() -> str:
    """The CPU's feature flags as the kernel reports them (part of every library's key)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    return f"{platform.machine()} {platform.processor()}"


def compile_shared(compiler: str, sources: Sequence[Path], flags: Sequence[str],
                   folder: Path, stem: str, *, headers: Sequence[Path] = (),
                   what: str = "the native code") -> tuple[Path | None, str]:
    """The library built from ``sources`` (``headers`` only hashed) with ``compiler`` and
    ``flags``, as ``folder/<stem>-<hash>.so``: compiled unless already there. Returns the
    path, or None and a one-line reason (no compiler, the compile failed)."""
    argv = shlex.split(compiler)
    if not argv or shutil.which(argv[0]) is None:
        return None, f"no C compiler: {compiler!r} not found (set CC)"
    try:
        version = subprocess.run([*argv, "--version"], capture_output=True, text=True,
                                 timeout=COMPILE_TIMEOUT_S, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"C compiler {compiler!r} does not run: {exc}"
    texts = (path.read_bytes() for path in (*sources, *headers))
    digest = hashlib.sha256(b"\0".join([*texts, " ".join(flags).encode(), version.encode(),
                                        cpu_flags().encode()])).hexdigest()[:16]
    final = folder / f"{stem}-{digest}.so"
    if final.exists():
        return final, ""
    tmp = folder / f".{final.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([*argv, *flags, "-o", str(tmp), *map(str, sources), "-lm"],
                              capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            return None, f"compiling {what} failed: {last}"
        os.replace(tmp, final)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"compiling {what} failed: {exc}"
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return final, ""
