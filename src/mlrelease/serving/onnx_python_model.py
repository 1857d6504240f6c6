"""Triton python-backend model that serves a version's model.onnx with onnxruntime (embedded CPU default).

Copied into each version directory of the CPU repository as model.py; runs inside Triton's python
stub, so it may import only what that environment has (numpy, onnxruntime, triton_python_backend_utils).
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Batch-aware ONNX Runtime execution of the version's model.onnx."""

    def initialize(self, args):
        """Load model.onnx from this version's directory."""
        config = json.loads(args["model_config"])
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.input_name = config["input"][0]["name"]
        self.output_names = [o["name"] for o in config["output"]]

    def execute(self, requests):
        """Run every request of the batch in one onnxruntime call, then split the outputs back."""
        inputs = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
        sizes = [x.shape[0] for x in inputs]
        outputs = self.session.run(self.output_names, {self.input_name: np.concatenate(inputs).astype(np.float32)})
        responses, start = [], 0
        for size in sizes:
            tensors = [
                pb_utils.Tensor(name, out[start : start + size])
                for name, out in zip(self.output_names, outputs, strict=True)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += size
        return responses
