"""The package's shape: layers, no import cycles, and function-level imports only with a
reason. import-linter reads the contracts from pyproject.toml ([tool.importlinter])."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "turboinfer"
PYPROJECT = SRC.parents[1] / "pyproject.toml"


def test_import_contracts_hold() -> None:
    """Layers (commands > optimize > prune > serve|bench > models > ...) and no cycle
    between the modules of any package, function-level imports included."""
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), str(PYPROJECT), "--no-cache"],
                            capture_output=True, text=True, cwd=PYPROJECT.parent, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def _nested_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: dict[int, ast.Import | ast.ImportFrom] = {}  # keyed by line: nested defs repeat
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.update((n.lineno, n) for n in ast.walk(node)
                         if isinstance(n, ast.Import | ast.ImportFrom))
    return list(found.values())


def _groups(imports: list[ast.Import | ast.ImportFrom]) -> list[tuple[int, int]]:
    """Line spans (first, last) of runs of consecutive function-level import statements."""
    spans: list[tuple[int, int]] = []
    for node in sorted(imports, key=lambda n: n.lineno):
        last = node.end_lineno or node.lineno
        if spans and spans[-1][1] + 1 == node.lineno:
            spans[-1] = (spans[-1][0], last)
        else:
            spans.append((node.lineno, last))
    return spans


def _has_reason(lines: list[str], first: int, last: int) -> bool:
    """A comment inside the run of imports or on the line just above it."""
    span = lines[first - 2:last] if first >= 2 else lines[:last]
    return any("#" in line for line in span)


@pytest.mark.parametrize("path", sorted(SRC.rglob("*.py")), ids=lambda p: str(p.relative_to(SRC)))
def test_function_level_imports_say_why(path: Path) -> None:
    """Imports inside functions are for optional or heavy dependencies only, and each
    says so in a comment; anything else belongs at the top of the module."""
    text = path.read_text()
    lines = text.splitlines()
    missing = [f"{path.relative_to(SRC)}:{first}"
               for first, last in _groups(_nested_imports(ast.parse(text)))
               if not _has_reason(lines, first, last)]
    assert not missing, "function-level imports without a reason comment: " + ", ".join(missing)
