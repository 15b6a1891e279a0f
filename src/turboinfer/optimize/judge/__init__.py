"""Judging variants: what a model's variants are judged on (the zoo's metric, the user's
labelled data, or fidelity to FP32 on held-out samples), decided once per run, and how each
variant's metric and latency are measured.
"""
