"""The top-level Python API names the issue promises."""

from pathlib import Path

import turboinfer


def test_optimize_and_tune_are_callable_from_the_package() -> None:
    import turboinfer.optimize.search.tuning  # importing submodules must not break it

    assert callable(turboinfer.optimize)
    assert turboinfer.optimize.optimize.__name__ == "optimize"
    assert callable(turboinfer.tune)


def test_optimize_through_the_package(tmp_path: Path) -> None:
    report = turboinfer.optimize("builtin:digits-cnn", tmp_path / "out", variants=["graph"])
    assert (tmp_path / "out" / "report.json").is_file()
    assert report is not None
