"""English text that ships with Python, for training and distilling without a download.

The demo LLM is trained on it (``scripts/train_demo_llm.py``) and the pruning benchmark
feeds it to MiniLM's distillation as extra text (``benchmarks/prune/run.py``).
"""

from __future__ import annotations

import ast
import functools
import sysconfig
from pathlib import Path

_SKIP = frozenset({"test", "tests", "site-packages", "idlelib", "lib2to3"})


def stdlib_docstrings(min_chars: int = 0) -> list[str]:
    """Docstrings of the standard library's modules, classes and functions, in file order.

    Test suites and third-party packages are skipped; ``min_chars`` drops short ones.
    """
    return [doc for doc in _all_docstrings() if len(doc) >= min_chars]


@functools.cache
def _all_docstrings() -> tuple[str, ...]:
    """Every docstring, stripped: parsing the whole standard library takes seconds, so a
    process does it once."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        if _SKIP & set(path.relative_to(root).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef |
                          ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    docs.append(doc.strip())
    return tuple(docs)
