"""An MLServer runtime that runs the ONNX file with onnxruntime (MLServer ships none)."""

import numpy as np
import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxRuntime(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        self._session = ort.InferenceSession(self.settings.parameters.uri, options,
                                             providers=["CPUExecutionProvider"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        batch = NumpyCodec.decode_input(payload.inputs[0]).astype(np.float32)
        (output,) = self._session.run(None, {"input": batch})
        return InferenceResponse(model_name=self.name,
                                 outputs=[NumpyCodec.encode_output("output", output)])
