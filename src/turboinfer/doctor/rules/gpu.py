"""GPU rules: none of them can judge a machine without a GPU, and they say so."""

from __future__ import annotations

from turboinfer.doctor.findings import Outcome, Rule, Skip
from turboinfer.doctor.inputs import Inputs


def gpu_utilisation(inputs: Inputs) -> Outcome:
    hardware = inputs.hardware
    assert hardware is not None
    if not hardware.gpus:
        return Skip("gpu_utilisation", "no GPU found through NVML")
    names = ", ".join(g.name for g in hardware.gpus)
    return Skip("gpu_utilisation", f"{names}: utilisation is not sampled over the window "
                                   "yet; read nvidia-smi dmon beside the load")


RULES = (Rule("gpu_utilisation", frozenset({"hardware"}), gpu_utilisation, "gpu"),)
