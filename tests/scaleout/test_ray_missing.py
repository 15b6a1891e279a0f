"""Without the ray extra, ``serve --ray`` fails with one line naming it (exit 2)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from turboinfer.cli import main


def test_serve_ray_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    assert main(["serve", str(tmp_path), "--ray"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'turboinfer[ray]'" in err
    assert err.count("\n") == 1 and "Traceback" not in err
