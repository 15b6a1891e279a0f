"""The declared Python version is the one the code relies on.

``asyncio.wait_for`` raises the builtin ``TimeoutError`` only from Python 3.11 on (before,
``asyncio.TimeoutError`` was a different class), and the server, the load tester and the
LLM engine catch the builtin. The package, the linter's target and the README must
therefore all say 3.11, so an older interpreter refuses to install it instead of
failing at the first queue timeout.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_requires_python_excludes_3_10() -> None:
    spec = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert "3.10.14" not in spec
    assert "3.11.0" in spec


def test_lint_and_type_targets_match_the_declaration() -> None:
    tools = _pyproject()["tool"]
    assert tools["ruff"]["target-version"] == "py311"
    assert tools["mypy"]["python_version"] == "3.11"


def test_readme_states_the_same_version() -> None:
    versions = re.findall(r"Python >= (\d+\.\d+)", (ROOT / "README.md").read_text())
    assert versions == ["3.11"]
