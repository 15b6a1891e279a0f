"""Which kind of model a reference names, decided from its text and the file system alone.

Kept free of torch so that resolving an ONNX file or a builtin never pays torch's import.
"""

from __future__ import annotations

import re
from pathlib import Path

BUILTIN = "builtin:"
# package.module:factory, as uvicorn and setuptools entry points spell it.
FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
SCRIPT_SUFFIXES = (".pt", ".pth", ".ts")  # TorchScript, read with torch.jit.load
PROGRAM_SUFFIX = ".pt2"  # torch.export, read with torch.export.load


def is_factory(ref: str) -> bool:
    return not ref.startswith(BUILTIN) and bool(FACTORY.match(ref))


def is_torch_file(ref: str) -> bool:
    return Path(ref).suffix in (*SCRIPT_SUFFIXES, PROGRAM_SUFFIX)


def is_hf_folder(ref: str) -> bool:
    path = Path(ref).expanduser()
    return path.is_dir() and (path / "config.json").is_file()


def is_source(ref: str) -> bool:
    """A model that is exported to ONNX on the fly: a factory, a torch file, an HF folder."""
    return is_factory(ref) or is_torch_file(ref) or is_hf_folder(ref)
