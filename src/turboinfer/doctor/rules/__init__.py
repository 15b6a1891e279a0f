"""The rule table: one module per family, each a tuple of ``Rule`` rows."""

from __future__ import annotations

from turboinfer.doctor.findings import Rule
from turboinfer.doctor.rules import (
    batching,
    cpu,
    gpu,
    latency,
    memory,
    quantization,
    window,
)

RULES: tuple[Rule, ...] = (*latency.RULES, *cpu.RULES, *memory.RULES, *window.RULES,
                           *batching.RULES, *quantization.RULES, *gpu.RULES)
