"""Structured pruning with knowledge distillation (Torch-Pruning's DepGraph underneath)."""
