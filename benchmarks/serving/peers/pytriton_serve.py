"""PyTriton: Triton's server (bundled, CPU) with an ONNX model run by onnxruntime in a
Python model, dynamic batching up to 32 rows. Tensor names and shapes come from the model.

Usage: pytriton_serve.py MODEL.onnx PORT [NAME [QUEUE_DELAY_US]]   (mlp, 2000 us)
"""

import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

options = ort.SessionOptions()
options.intra_op_num_threads = 2
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
INPUT = session.get_inputs()[0]
OUTPUT = session.get_outputs()[0]
name = sys.argv[3] if len(sys.argv) > 3 else "mlp"
delay_us = int(sys.argv[4]) if len(sys.argv) > 4 else 2000


@batch
def infer(**inputs: np.ndarray) -> dict:
    return {OUTPUT.name: session.run(None, {INPUT.name: inputs[INPUT.name]})[0]}


def per_row(shape: list) -> tuple:
    return tuple(int(d) for d in shape[1:])  # the first axis is the batch


port = int(sys.argv[2])
config = TritonConfig(http_port=port, grpc_port=port + 1, metrics_port=port + 2)
with Triton(config=config) as triton:
    triton.bind(model_name=name, infer_func=infer,
                inputs=[Tensor(name=INPUT.name, dtype=np.float32, shape=per_row(INPUT.shape))],
                outputs=[Tensor(name=OUTPUT.name, dtype=np.float32,
                                shape=per_row(OUTPUT.shape))],
                config=ModelConfig(max_batch_size=32, batcher=DynamicBatcher(
                    max_queue_delay_microseconds=delay_us)))
    print("ready", flush=True)
    triton.serve()
