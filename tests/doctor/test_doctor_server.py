"""URL mode against a real server: batching off under 32 concurrent clients queues."""

from __future__ import annotations

import threading

from turboinfer.doctor.api import DoctorRequest, run_doctor
from turboinfer.load.scenarios import Scenario, ScenarioSettings
from turboinfer.load.session import LoadSettings, run_load

MODEL = "linear"  # the model the unbatched_server fixture serves


def test_doctor_names_queueing_with_queue_time(unbatched_server: str) -> None:
    settings = LoadSettings(url=unbatched_server, model=MODEL, metrics_url="",
                            min_requests=1, scenario=ScenarioSettings(
                                scenario=Scenario.CONCURRENCY, concurrency=(32,),
                                window_s=1.0, max_windows=5, stable_windows=5,
                                warmup_s=0.5))
    load = threading.Thread(target=run_load, args=(settings,))
    load.start()
    try:
        diagnosis = run_doctor(DoctorRequest(url=unbatched_server, model=MODEL,
                                             window_s=3.0))
    finally:
        load.join()
    found = {f.rule: f for f in diagnosis.findings}
    assert "queueing" in found, diagnosis.to_dict()
    queueing = found["queueing"]
    assert "queue" in queueing.evidence and "ms vs compute" in queueing.evidence
    assert "max_batch_size 0" in queueing.evidence
    assert queueing.fix.startswith("config.yaml: max_batch_size:")
    # The model is served on the CPU: the GPU rules say so instead of passing.
    skipped = {s.rule: s.reason for s in diagnosis.skipped}
    assert skipped["gpu_utilisation"] == skipped["gpu_memory"]
    assert skipped["gpu_utilisation"].startswith(f"{MODEL} is served on the CPU")
    assert "gpu_utilisation" not in diagnosis.passed
