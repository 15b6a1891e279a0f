"""Kernel choices remembered on disk per machine (``decision_cache``): a second load
times nothing and chooses the same kernels; ``refresh`` and ``off`` do what they say; a
choice today's candidates lack, or a damaged file, is measured again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from turboinfer.llm.backends.cpu import decision_cache, kernels
from turboinfer.llm.backends.cpu.kernels import KernelChoice, select_kernels
from turboinfer.llm.model.config import QuantMode
from turboinfer.llm.model.loader import load_model


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The decision file of the test's own (the cache folder stays the suite's: a new one
    # would compile the native library into it again).
    monkeypatch.setattr(decision_cache, "_path", lambda: tmp_path / "kernels.json")
    monkeypatch.setenv(decision_cache.MODE_ENV, "on")


@pytest.fixture
def measured(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """No choices in this process's memory, and a count of the shapes timed."""
    monkeypatch.setattr(kernels, "_DECISIONS", {})
    calls: list[int] = []
    timed = kernels.measure_shape

    def counting(*args: object, **kwargs: object) -> KernelChoice:
        calls.append(1)
        return timed(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(kernels, "measure_shape", counting)
    return calls


def _load(folder: Path, monkeypatch: pytest.MonkeyPatch) -> list[KernelChoice]:
    """A load in a fresh process, as far as the choices go: nothing kept in memory."""
    monkeypatch.setattr(kernels, "_DECISIONS", {})
    return select_kernels(load_model(folder), QuantMode.INT8)


def _picks(choices: list[KernelChoice]) -> list[tuple[int, int, int, str]]:
    return sorted((c.out_features, c.in_features, c.rows, c.chosen) for c in choices)


def test_a_second_load_times_nothing_and_refresh_times_again(
        tiny_llama_dir: Path, measured: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    first = _load(tiny_llama_dir, monkeypatch)
    timed = len(measured)
    assert timed > 0 and not any(c.remembered for c in first)
    path = decision_cache._path()
    stored = json.loads(path.read_text())
    assert len(stored) == timed
    second = _load(tiny_llama_dir, monkeypatch)
    assert len(measured) == timed                      # nothing timed again
    assert all(c.remembered for c in second)
    assert _picks(second) == _picks(first)
    # What was timed the first time is still there to read (llm bench --json).
    assert [c.timings_ms for c in second] == [c.timings_ms for c in first]
    monkeypatch.setenv(decision_cache.MODE_ENV, "refresh")
    assert not any(c.remembered for c in _load(tiny_llama_dir, monkeypatch))
    assert len(measured) == 2 * timed
    assert len(json.loads(path.read_text())) == timed


def test_off_neither_reads_nor_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    decision_cache.store("key", {"chosen": "x"})
    assert decision_cache.load("key") == {"chosen": "x"}
    monkeypatch.setenv(decision_cache.MODE_ENV, "off")
    assert decision_cache.load("key") is None
    decision_cache._path().unlink()
    decision_cache.store("key", {"chosen": "x"})
    assert not decision_cache._path().exists()


def test_an_unknown_kernel_or_a_damaged_file_is_timed_again(
        tiny_llama_dir: Path, measured: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    _load(tiny_llama_dir, monkeypatch)
    timed = len(measured)
    path = decision_cache._path()
    entries = json.loads(path.read_text())
    key = next(iter(entries))
    entries[key]["chosen"] = "a kernel of another release"
    path.write_text(json.dumps(entries))
    choices = _load(tiny_llama_dir, monkeypatch)
    assert len(measured) == timed + 1                  # that one shape only
    assert sum(not c.remembered for c in choices) == 1
    assert json.loads(path.read_text())[key]["chosen"] != "a kernel of another release"
    # A damaged file reads as empty (every shape timed again) and is written whole anew.
    path.write_text("{not json")
    assert decision_cache.load(key) is None
    decision_cache.store(key, entries[key])
    assert json.loads(path.read_text()) == {key: entries[key]}


def test_the_file_is_named_for_this_machine_and_library(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()      # the real path (only its name is read)
    key = decision_cache.machine_key()
    assert len(key) == 16 and key == decision_cache.machine_key()
    assert decision_cache._machine_key("another library") != key
    path = decision_cache._path()
    assert (path.parent.name, path.name) == ("kernels", f"{key}.json")


def test_the_thread_count_is_remembered_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    from turboinfer.llm.backends.cpu import threads

    before = torch.get_num_threads()
    try:
        first = threads.choose_threads(64, 256, usable=2)
        assert not first.remembered and set(first.timings_ms) == {"1", "2"}
        torch.set_num_threads(3 - first.threads)      # the other count
        again = threads.choose_threads(64, 256, usable=2)
        assert again.remembered and again.threads == first.threads
        assert again.timings_ms == first.timings_ms
        assert torch.get_num_threads() == first.threads
        # Another shape is timed; refresh times again.
        assert not threads.choose_threads(64, 128, usable=2).remembered
        monkeypatch.setenv(decision_cache.MODE_ENV, "refresh")
        assert not threads.choose_threads(64, 256, usable=2).remembered
    finally:
        torch.set_num_threads(before)
