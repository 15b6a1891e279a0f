"""PyTriton serving an image classifier from encoded JPEG bytes: the Python callable
decodes each image with Pillow, resizes it (shorter side 256), centre-crops 224x224,
normalizes with ImageNet's mean and std, and runs the ONNX model with onnxruntime
(2 intra-op threads); Triton's dynamic batcher merges up to 32 requests, no queue delay.

The image steps are the ones ``turboinfer serve`` runs for the zoo's image models
(``turboinfer.serve.images``): a JPEG decoded at a reduced DCT scale when it is much
larger than needed (``Image.draft``), only the centre crop resampled, bilinear, then one
multiply and one add per value. The images of a batch are decoded on a thread pool
(Pillow and numpy release the GIL), as the server does.

Usage: pytriton_jpeg.py MODEL.onnx PORT [NAME [DECODE_THREADS]]   (resnet18, the core count)
Input ``image`` (BYTES, one encoded image per row), output the model's first output.
"""

import io
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
from PIL import Image
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

RESIZE, CROP = 256, 224
MEAN = np.asarray((0.485, 0.456, 0.406), np.float32).reshape(3, 1, 1)
STD = np.asarray((0.229, 0.224, 0.225), np.float32).reshape(3, 1, 1)
SCALE = (1.0 / (255.0 * STD)).astype(np.float32)
BIAS = (-MEAN / STD).astype(np.float32)

options = ort.SessionOptions()
options.intra_op_num_threads = 2
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
INPUT = session.get_inputs()[0]
OUTPUT = session.get_outputs()[0]
name = sys.argv[3] if len(sys.argv) > 3 else "resnet18"
threads = int(sys.argv[4]) if len(sys.argv) > 4 else (os.cpu_count() or 1)
pool = ThreadPoolExecutor(threads)


def crop_pixels(raw: bytes) -> np.ndarray:
    """One encoded image -> its ``[CROP, CROP, 3]`` uint8 centre crop."""
    with Image.open(io.BytesIO(raw)) as image:
        width, height = image.size
        scale = RESIZE / min(width, height)
        if image.format == "JPEG":
            image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
        rgb = image.convert("RGB")
    factor = rgb.width / width
    side = min(CROP / scale * factor, rgb.width, rgb.height)
    left, top = (rgb.width - side) / 2, (rgb.height - side) / 2
    return np.asarray(rgb.resize((CROP, CROP), Image.Resampling.BILINEAR,
                                 box=(left, top, left + side, top + side)))


def prepare(raw: bytes, out: np.ndarray) -> None:
    np.multiply(crop_pixels(raw).transpose(2, 0, 1), SCALE, out=out)
    np.add(out, BIAS, out=out)


@batch
def infer(image: np.ndarray) -> dict:
    files = image.reshape(-1)
    tensor = np.empty((len(files), 3, CROP, CROP), np.float32)
    list(pool.map(prepare, [bytes(f) for f in files], tensor))
    return {OUTPUT.name: session.run(None, {INPUT.name: tensor})[0]}


port = int(sys.argv[2])
config = TritonConfig(http_port=port, grpc_port=port + 1, metrics_port=port + 2)
with Triton(config=config) as triton:
    triton.bind(model_name=name, infer_func=infer,
                inputs=[Tensor(name="image", dtype=np.bytes_, shape=(1,))],
                outputs=[Tensor(name=OUTPUT.name, dtype=np.float32,
                                shape=tuple(int(d) for d in OUTPUT.shape[1:]))],
                config=ModelConfig(max_batch_size=32, batcher=DynamicBatcher(
                    max_queue_delay_microseconds=0)))
    print("ready", flush=True)
    triton.serve()
