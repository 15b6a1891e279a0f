"""Judging variants: what a model's variants are judged on (the zoo's metric, the user's
labelled data, or fidelity to FP32 on held-out samples), and how each variant's metric and
latency are measured. A device's timing (CUDA events after warm-up) belongs here.
"""
