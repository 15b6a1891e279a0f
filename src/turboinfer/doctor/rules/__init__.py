"""The rule table: one module per family, each a tuple of ``Rule`` rows."""

from __future__ import annotations

from turboinfer.doctor.findings import Rule
from turboinfer.doctor.rules import batching, cpu, gpu, latency, memory, quantization

RULES: tuple[Rule, ...] = (*latency.RULES, *cpu.RULES, *memory.RULES, *batching.RULES,
                           *quantization.RULES, *gpu.RULES)
