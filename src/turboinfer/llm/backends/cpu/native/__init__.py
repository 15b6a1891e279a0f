"""Hand-written CPU kernels for the linear layers (``kernels.c``), compiled on first use
with the system C compiler and loaded with ctypes. Where there is no compiler, the
compile fails or the library does not load, ``native_status()`` says why and the engine
keeps torch's kernels."""

from turboinfer.llm.backends.cpu.native.loader import (
    DISABLE_ENV,
    NativeLibrary,
    NativeStatus,
    build_library,
    native_status,
)

__all__ = ["DISABLE_ENV", "NativeLibrary", "NativeStatus", "build_library", "native_status"]
