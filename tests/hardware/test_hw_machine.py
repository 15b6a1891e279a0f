"""``profile()`` on the machine the tests run on, and ``turboinfer hw``."""

from __future__ import annotations

import json
import os

import pytest

from turboinfer.cli import main
from turboinfer.hardware import HardwareProfile, profile


@pytest.fixture(scope="module")
def here() -> HardwareProfile:
    return profile()


def test_cpu_is_sane(here: HardwareProfile) -> None:
    cpu = here.cpu
    assert cpu.logical_cores >= 1
    assert cpu.model_name and cpu.vendor and cpu.architecture
    assert 1 <= cpu.usable_cores <= cpu.logical_cores
    assert cpu.physical_cores is None or 1 <= cpu.physical_cores <= cpu.logical_cores
    if hasattr(os, "sched_getaffinity"):
        assert set(cpu.affinity) == os.sched_getaffinity(0)
    if cpu.architecture == "x86_64":
        assert "sse4_2" in cpu.features


def test_memory_is_sane(here: HardwareProfile) -> None:
    assert 0 < here.memory.available_bytes <= here.memory.total_bytes


def test_onnxruntime_is_found(here: HardwareProfile) -> None:
    ort = here.engine("onnxruntime")
    assert ort is not None and ort.version
    assert "CPUExecutionProvider" in ort.providers
    assert {e.name for e in here.engines} == {"onnxruntime", "openvino", "torch"}


def test_summary_and_round_trip(here: HardwareProfile) -> None:
    assert here.summary()["logical_cores"] == here.cpu.logical_cores
    assert HardwareProfile.from_dict(json.loads(json.dumps(here.to_dict()))) == here


def test_hw_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hw", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)  # the whole of stdout is one document
    assert {"cpu", "memory", "gpus", "engines", "recommendations"} <= data.keys()
    assert {"model_name", "features", "caches", "usable_cores"} <= data["cpu"].keys()
    assert all(isinstance(line, str) for line in data["recommendations"])


def test_hw_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hw"]) == 0
    out = capsys.readouterr().out
    for section in ("CPU", "Memory", "GPU", "Engines", "Worth trying"):
        assert f"\n{section}\n" in f"\n{out}"
