"""PyTriton: Triton's server (bundled, CPU) with the ONNX model run by onnxruntime in a
Python model, dynamic batching up to 32 rows. Usage: pytriton_serve.py MODEL.onnx PORT"""

import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

options = ort.SessionOptions()
options.intra_op_num_threads = 2
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])


@batch
def infer(input: np.ndarray) -> dict:
    return {"output": session.run(None, {"input": input})[0]}


port = int(sys.argv[2])
config = TritonConfig(http_port=port, grpc_port=port + 1, metrics_port=port + 2)
with Triton(config=config) as triton:
    triton.bind(model_name="mlp", infer_func=infer,
                inputs=[Tensor(name="input", dtype=np.float32, shape=(256,))],
                outputs=[Tensor(name="output", dtype=np.float32, shape=(10,))],
                config=ModelConfig(max_batch_size=32, batcher=DynamicBatcher(
                    max_queue_delay_microseconds=2000)))
    print("ready", flush=True)
    triton.serve()
