"""Triton python-backend model that serves a version's model.onnx with onnxruntime (embedded CPU default).

Copied into each version directory of the CPU repository as model.py, next to the version's model.onnx and
the export's record model_config.json; runs inside Triton's python stub, so it may import only what that
environment has (numpy, onnxruntime, triton_python_backend_utils), never mlrelease.

At initialize it refuses (a RuntimeError fails Triton's load of this version) a model.onnx whose SHA-256 or
size is not what the export recorded, and a graph whose outputs are not exactly the config's (name, type,
full shape): the server then reports the load as failed, instead of serving bytes nobody checked or
answering with tensors the clients do not expect. Inputs are left to the runtime on purpose: a graph with
the wrong input width loads and fails each request, which is the `error` drill of mlrelease_drills/faults.py.

Triton runs the config's `model_warmup` samples through `execute` right after `initialize`, before the
version is ready, so a new version's first real request finds onnxruntime and the stub's IPC warm. The
rows of those samples are counted from the config: while they last, a batch that fails is answered with
NaN instead of an error, because Triton refuses to load a version whose warmup fails, and the `error`
drill is a version that loads and then fails every request. NaN is what the gateway's guard refuses, so
even a miscount could never pass a warmup answer off as a real one.
"""

import hashlib
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

# onnxruntime's tensor types in Triton's spelling, so a refusal reads like the config it compares with.
_TRITON_TYPES = {
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(float16)": "FP16",
    "tensor(int64)": "INT64",
    "tensor(int32)": "INT32",
    "tensor(bool)": "BOOL",
}


def _verified_bytes(directory, version):
    """model.onnx of this version, read once; an exception naming both digests when it is not the recorded file."""
    path = os.path.join(directory, "model.onnx")
    record = os.path.join(directory, "model_config.json")
    if not os.path.isfile(record):
        raise RuntimeError(f"v{version} has no export record {record}: refusing to serve {path}")
    with open(record, encoding="utf-8") as fh:
        meta = json.load(fh)
    with open(path, "rb") as fh:
        data = fh.read()
    digest, recorded, size = hashlib.sha256(data).hexdigest(), str(meta.get("sha256")), meta.get("size")
    if digest != recorded or (size is not None and int(size) != len(data)):
        raise RuntimeError(
            f"v{version} model.onnx at {path} has sha256 {digest[:12]}… ({len(data)} bytes) on disk, export "
            f"recorded {recorded[:12]}… ({size} bytes): the file that would be served is not the file that was checked"
        )
    return data


def _output_problems(session, config):
    """How the session's outputs differ from the config's (name, type, full shape with the batch dimension)."""
    batch = [-1] if int(config.get("max_batch_size", 0)) > 0 else []
    found = {o.name: o for o in session.get_outputs()}
    problems = []
    for declared in config["output"]:
        name = declared["name"]
        dims = declared["reshape"]["shape"] if "reshape" in declared else declared["dims"]
        want_shape = batch + [int(d) for d in dims]
        want_type = declared["data_type"].removeprefix("TYPE_")
        if name not in found:
            problems.append(f"output {name}: expected {want_type} {want_shape}, found no such graph output")
            continue
        shape = [d if isinstance(d, int) else -1 for d in (found[name].shape or [])]  # symbolic dims are any size
        found_type = _TRITON_TYPES.get(found[name].type, found[name].type)
        if found_type != want_type or shape != want_shape:
            problems.append(f"output {name}: expected {want_type} {want_shape}, found {found_type} {shape}")
    return problems


def _warmup_rows(config):
    """Rows Triton sends through `execute` for the config's model_warmup samples (each runs `count` times, min 1)."""
    return sum(
        max(int(sample.get("batch_size", 1)), 1) * max(int(sample.get("count", 0)), 1)
        for sample in config.get("model_warmup", [])
    )


class TritonPythonModel:
    """Batch-aware ONNX Runtime execution of the version's model.onnx."""

    def initialize(self, args):
        """Load this version's model.onnx after checking it is the exported file and matches the config's outputs."""
        config = json.loads(args["model_config"])
        version = args["model_version"]
        directory = os.path.join(args["model_repository"], version)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        # The session is built from the verified bytes themselves, so no later change to the file can slip in.
        self.session = ort.InferenceSession(
            _verified_bytes(directory, version), options, providers=["CPUExecutionProvider"]
        )
        problems = _output_problems(self.session, config)
        if problems:
            raise RuntimeError(f"v{version} graph does not match the config: {'; '.join(problems)}")
        self.input_name = config["input"][0]["name"]
        self.output_names = [o["name"] for o in config["output"]]
        self.version = version
        self.warmup_rows_left = _warmup_rows(config)

    def execute(self, requests):
        """Run every request of the batch in one onnxruntime call, then split the outputs back."""
        inputs = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
        sizes = [x.shape[0] for x in inputs]
        warming = self.warmup_rows_left > 0
        self.warmup_rows_left -= sum(sizes)
        try:
            outputs = self.session.run(self.output_names, {self.input_name: np.concatenate(inputs).astype(np.float32)})
        except Exception as exc:
            if not warming:
                raise
            print(f"v{self.version}: warmup sample failed ({exc}); real requests will fail the same way", flush=True)
            outputs = [np.full((sum(sizes), 1), np.nan, dtype=np.float32) for _ in self.output_names]
        responses, start = [], 0
        for size in sizes:
            tensors = [
                pb_utils.Tensor(name, out[start : start + size])
                for name, out in zip(self.output_names, outputs, strict=True)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += size
        return responses
