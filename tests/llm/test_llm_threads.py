"""The engine's thread count: candidates from the profile, the fastest by measurement."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from turboinfer.cli import main
from turboinfer.llm.backends.cpu.threads import candidate_counts, choose_threads


@pytest.fixture(autouse=True)
def _restore_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_candidate_counts() -> None:
    assert candidate_counts(1) == [1]
    assert candidate_counts(2) == [1, 2]
    assert candidate_counts(6) == [1, 2, 4, 6]


def test_choice_is_the_fastest_candidate_and_is_applied() -> None:
    choice = choose_threads(64, 128, usable=2)
    assert set(choice.timings_ms) == {"1", "2"}
    one, two = choice.timings_ms["1"], choice.timings_ms["2"]
    assert choice.threads == (2 if two < 0.9 * one else 1)
    assert torch.get_num_threads() == choice.threads
    # One usable core: nothing to measure.
    assert choose_threads(64, 128, usable=1).threads == 1


def test_bench_states_the_threads_it_used(tiny_llm_dir: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    args = ["llm", "bench", str(tiny_llm_dir), "--concurrency", "1", "--prompt-len", "4",
            "--gen-len", "2", "--json"]
    assert main([*args, "--threads", "1"]) == 0
    fixed = json.loads(capsys.readouterr().out)
    assert fixed["threads"] == 1 and fixed["thread_choice"] is None
    assert main(args) == 0
    measured = json.loads(capsys.readouterr().out)
    assert measured["threads"] == measured["thread_choice"]["threads"]
