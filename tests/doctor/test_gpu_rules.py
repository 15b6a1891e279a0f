"""The GPU path on recorded NVML samples: pynvml's calls answered from tests/doctor/data/
nvml, through the server's real exporter (``Metrics``), the doctor's /metrics reader and
the rules. No GPU here, so NVML itself is the only part replayed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from turboinfer.doctor import Inputs, Skip, diagnose
from turboinfer.doctor.rules import gpu
from turboinfer.doctor.server import GpuUse, Percentiles, ServerWindow, gpu_use
from turboinfer.hardware import profile
from turboinfer.hardware.gpu import GpuSampler
from turboinfer.load.metrics import parse
from turboinfer.serve.metrics import Metrics

NVML = Path(__file__).parent / "data" / "nvml"


class ReplayedNvml:
    """The pynvml calls GpuSampler makes, each GPU's next recorded sample per read."""

    def __init__(self, recording: dict[str, Any]) -> None:
        self.gpus = recording["gpus"]
        self.reads = [0] * len(self.gpus)

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self.gpus[handle]["name"])

    def _sample(self, handle: int) -> dict[str, int]:
        samples = self.gpus[handle]["samples"]
        sample: dict[str, int] = samples[self.reads[handle] % len(samples)]
        return sample

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        sample = self._sample(handle)
        return SimpleNamespace(gpu=sample["gpu"], memory=sample["memory"])

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        sample, total = self._sample(handle), self.gpus[handle]["memory_total"]
        self.reads[handle] += 1  # memory is read last: the next read is the next sample
        return SimpleNamespace(used=sample["memory_used"], total=total,
                               free=total - sample["memory_used"])


def recording(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads((NVML / name).read_bytes())
    return doc


def scraped_gpus(name: str) -> tuple[GpuUse, ...]:
    """Every recorded sample scraped once from a real ``Metrics`` page, then read back."""
    rec = recording(name)
    metrics = Metrics(gpus=GpuSampler(ReplayedNvml(rec)))
    metrics.serving(metrics.for_version("resnet50", "1", on_gpu=True))
    scrapes = [parse(metrics.render().decode()) for _ in rec["gpus"][0]["samples"]]
    return gpu_use(scrapes)


def window(gpus: tuple[GpuUse, ...], *, requests: float = 600.0,
           on_gpu: bool | None = True) -> ServerWindow:
    """A 10 s window of a batching server with the given GPUs."""
    latency = Percentiles(p50_ms=4.0, p99_ms=9.0, mean_ms=4.5)
    return ServerWindow(
        url="http://127.0.0.1:8000", model="resnet50", seconds=10.0, requests=requests,
        failures=0.0, request=latency, queue=None, compute=latency, queue_mean_ms=0.2,
        compute_mean_ms=4.3, avg_batch=1.1, max_batch_size=8, batch_efficiency=1.1 / 8,
        max_pending=1.0, cpu_cores=0.8, instances=1, gpus=gpus, on_gpu=on_gpu)


def test_the_exporter_and_the_reader_keep_each_gpus_figures() -> None:
    rec = recording("small-batches.json")["gpus"][0]
    (use,) = scraped_gpus("small-batches.json")
    assert (use.gpu, use.name, use.samples) == ("0", rec["name"], len(rec["samples"]))
    assert use.utilisation == pytest.approx(
        sum(s["gpu"] for s in rec["samples"]) / len(rec["samples"]) / 100)
    assert use.memory_used_bytes == max(s["memory_used"] for s in rec["samples"])
    assert use.memory_total_bytes == rec["memory_total"]


def test_a_gpu_waiting_on_small_batches_is_named() -> None:
    diagnosis = diagnose(Inputs(hardware=profile(engines=False, gpus=False),
                                server=window(scraped_gpus("small-batches.json"))))
    found = {f.rule: f for f in diagnosis.findings}
    finding = found["gpu_utilisation"]
    assert finding.symptom == ("GPU 0 (NVIDIA A100-SXM4-40GB) busy 12% of the window while "
                               "resnet50 served 60 requests/s")
    assert finding.evidence == ("mean SM activity 12% over 5 NVML samples; batches averaged "
                                "1.10 rows (max_batch_size 8), 1 instance(s)")
    assert finding.fix == ("config.yaml: max_batch_size: 16, dynamic_batching: "
                           "{max_queue_delay_ms: 2}, instances: 2 (another stream)")
    assert "gpu_memory" in diagnosis.passed


def test_a_full_gpu_memory_is_named_and_a_busy_gpu_is_not() -> None:
    diagnosis = diagnose(Inputs(hardware=profile(engines=False, gpus=False),
                                server=window(scraped_gpus("memory-full.json"))))
    found = {f.rule: f for f in diagnosis.findings}
    assert "gpu_utilisation" in diagnosis.passed
    finding = found["gpu_memory"]
    assert finding.symptom == "GPU 0 (NVIDIA L4) memory 96% full at the window's peak"
    assert finding.evidence.startswith("21.6 of 22.5 GiB in use (NVML)")
    assert finding.fix == "config.yaml: max_batch_size: 4; instances: 1"


def test_a_server_with_no_model_on_a_gpu_exports_no_gpu_samples() -> None:
    metrics = Metrics(gpus=GpuSampler(ReplayedNvml(recording("small-batches.json"))))
    metrics.serving(metrics.for_version("digits", "1", on_gpu=False))
    assert gpu_use([parse(metrics.render().decode())]) == ()
    metrics.serving(metrics.for_version("resnet50", "1", on_gpu=True))
    assert len(gpu_use([parse(metrics.render().decode())])) == 1


def test_a_model_served_on_the_cpu_skips_the_gpu_rules_instead_of_passing() -> None:
    busy_gpu_cpu_model = window(scraped_gpus("small-batches.json"), on_gpu=False)
    diagnosis = diagnose(Inputs(hardware=profile(engines=False, gpus=False),
                                server=busy_gpu_cpu_model))
    reasons = {s.rule: s.reason for s in diagnosis.skipped}
    assert "gpu_utilisation" not in diagnosis.passed and "gpu_memory" not in diagnosis.passed
    assert reasons["gpu_utilisation"].startswith("resnet50 is served on the CPU")


def test_too_few_requests_say_nothing_about_utilisation() -> None:
    idle = window(scraped_gpus("small-batches.json"), requests=gpu.MIN_REQUESTS - 1)
    assert gpu.gpu_utilisation(Inputs(server=idle)) is None


def test_without_nvml_the_rules_say_why() -> None:
    no_gpu = diagnose(Inputs(hardware=profile(engines=False, gpus=False),
                             server=window(())))
    reasons = {s.rule: s.reason for s in no_gpu.skipped}
    assert reasons["gpu_utilisation"] == reasons["gpu_memory"] == gpu.NO_SERVER_GPU


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None,
                    reason="nvidia-ml-py is installed here")
def test_the_sampler_names_the_missing_extra() -> None:
    sampler = GpuSampler()
    assert sampler.sample() == ()
    assert sampler.note is not None and "turboinfer[gpu]" in sampler.note


def test_a_driver_that_does_not_start_is_a_note_not_an_error() -> None:
    class NoDriver(ReplayedNvml):
        def nvmlInit(self) -> None:
            raise RuntimeError("NVML Shared Library Not Found")

    sampler = GpuSampler(NoDriver(recording("small-batches.json")))
    assert sampler.sample() == ()
    assert sampler.note == "NVML did not start: NVML Shared Library Not Found"
    assert isinstance(gpu.gpu_utilisation(Inputs(hardware=profile(engines=False, gpus=False))),
                      Skip)
