"""Quantization-aware training: fine-tune a model as the deployed INT8 graph will run it.

``fakequant`` emulates ONNX Runtime's static QDQ scheme in torch (per-channel symmetric
int8 weights, per-tensor asymmetric 8-bit activations at every conv/linear input, with
BatchNorm frozen as the engine folds it); ``train`` fine-tunes with the loop pruning
uses (labels, or distillation from the float model) and bakes the learned activation
ranges into the model as clamps, so the engine's own static quantizer, calibrated with
MinMax, takes exactly those ranges.
"""

from turboinfer.qat.train import QATSettings, qat_finetune

__all__ = ["QATSettings", "qat_finetune"]
