"""Ray Serve with @serve.batch (32 rows, 2 ms) behind the OIP v2 JSON routes a load test
needs (metadata and infer). Usage: ray_serve.py MODEL.onnx PORT"""

import sys

import numpy as np
import onnxruntime as ort
from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse

MODEL_PATH, PORT = sys.argv[1], int(sys.argv[2])
METADATA = {"name": "mlp", "versions": ["1"], "platform": "ray",
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 256]}],
            "outputs": [{"name": "output", "datatype": "FP32", "shape": [-1, 10]}]}


@serve.deployment(max_ongoing_requests=256)
class Mlp:
    def __init__(self) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        self.session = ort.InferenceSession(MODEL_PATH, options,
                                            providers=["CPUExecutionProvider"])

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.002)
    async def run(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        sizes = [r.shape[0] for r in rows]
        out = self.session.run(None, {"input": np.concatenate(rows)})[0]
        return np.split(out, np.cumsum(sizes)[:-1])

    async def __call__(self, request: Request) -> JSONResponse:
        if request.method == "GET":
            return JSONResponse(METADATA)
        tensor = (await request.json())["inputs"][0]
        rows = np.asarray(tensor["data"], np.float32).reshape(tensor["shape"])
        out = await self.run(rows)
        return JSONResponse({"model_name": "mlp", "outputs": [{
            "name": "output", "datatype": "FP32", "shape": list(out.shape),
            "data": out.reshape(-1).tolist()}]})


serve.start(http_options={"host": "127.0.0.1", "port": PORT})
serve.run(Mlp.bind(), route_prefix="/v2/models/mlp", blocking=False)
print("ready", flush=True)
import time  # noqa: E402

while True:
    time.sleep(3600)
