"""The model that is served is the model that was checked: a version's bytes and graph against what export recorded.

Two checks, both pure (files and the registry only, never Triton), for any step that is about to use a version:

- `verify_version`: the SHA-256 and size of `<root>/<model>/<version>/model.onnx` equal what the export
  wrote into that version's model_config.json and, given a Registry, the version's MLflow tag `onnx_sha256`.
  Steps that load, measure, compare or promote a version call it first::

      from mlrelease.serving.integrity import verify_version
      verify_version(model_repository(settings), version, registry=registry)  # GateFailed (exit 3) on a swap

- `graph_problems`: the ONNX checker (full check), strict shape inference, and the graph's inputs and outputs
  (names, element types, full shapes) against the Triton config that will serve it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlrelease.errors import GateFailed, StepError
from mlrelease.registry import MODEL_NAME
from mlrelease.serving.triton_repo import METADATA_FILE, MODEL_FILE, read_config, version_dir

if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as mc

    from mlrelease.registry import Registry

REGISTRY_TAG = "onnx_sha256"
_SHOWN = 12  # hex characters of a digest in a message: enough to tell two files apart at a glance
Tensors = dict[str, tuple[str, list[int]]]  # name → (Triton type without TYPE_, full shape; -1 = any size)


def verified_bytes(root: Path, version: int, *, registry: Registry | None = None, model: str = MODEL_NAME) -> bytes:
    """The bytes of a version's model.onnx, read once and checked against the export's record (see verify_version).

    Callers that go on to use the bytes (parity, conversion checks) use these, so what they derive is from
    exactly the bytes that were verified, not from a second read of a file that may have changed since.
    """
    return _verified(root, version, registry, model)[0]


def _verified(root: Path, version: int, registry: Registry | None, model: str) -> tuple[bytes, str]:
    """(bytes, sha256) of a version's model.onnx once it matched its record; raises as verify_version says."""
    directory = version_dir(root, model, version)
    model_path, meta_path = directory / MODEL_FILE, directory / METADATA_FILE
    if not model_path.is_file():
        raise StepError(f"v{version} has no {MODEL_FILE} at {model_path}: re-export version {version}")
    if not meta_path.is_file():
        raise StepError(f"v{version} has no export record {meta_path}: re-export version {version}")
    try:
        meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise StepError(f"v{version} export record {meta_path} is unreadable: {exc}") from None
    recorded = meta.get("sha256")
    if not isinstance(recorded, str) or len(recorded) != 64:
        raise StepError(f"v{version} export record {meta_path} holds no sha256 of {MODEL_FILE}: re-export it")
    data = model_path.read_bytes()
    digest, size = hashlib.sha256(data).hexdigest(), len(data)
    recorded_size = meta.get("size")  # absent in records written before sizes were kept: the digest decides
    if digest != recorded or (recorded_size is not None and int(recorded_size) != size):
        _refuse(version, model_path, digest, size, "export recorded", recorded, recorded_size)
    if registry is not None:
        # Export sets the tag last, so a version whose export has not completed has none yet; the file and its
        # record are still checked above, and a rewritten record (file and json swapped together) is caught here.
        tagged = registry.version_tags(version).get(REGISTRY_TAG)
        if tagged is not None and tagged != digest:
            _refuse(version, model_path, digest, size, f"the registry's {REGISTRY_TAG} tag records", tagged, None)
    return data, digest


def verify_version(root: Path, version: int, *, registry: Registry | None = None, model: str = MODEL_NAME) -> str:
    """A version's model.onnx SHA-256, checked against the export's record: GateFailed on a mismatch, StepError if gone.

    The record is the version's model_config.json (sha256, and size where recorded) and, given `registry`,
    the MLflow version tag `onnx_sha256` (when export has set it). No Triton is involved.
    """
    return _verified(root, version, registry, model)[1]


def verify_policy(root: Path, *, registry: Registry | None = None) -> dict[int, str]:
    """Verify every version the model's config.pbtxt tells Triton to serve; their digests by version."""
    config = read_config(root, MODEL_NAME)
    return {v: verify_version(root, v, registry=registry) for v in config.version_policy.specific.versions}


def verify_each(
    root: Path, versions: list[int], *, registry: Registry | None = None, model: str = MODEL_NAME
) -> tuple[dict[int, str], dict[int, str]]:
    """(digest of each version that verifies, why each other one does not): one bad file refuses only itself."""
    digests: dict[int, str] = {}
    refused: dict[int, str] = {}
    for version in versions:
        try:
            digests[version] = verify_version(root, version, registry=registry, model=model)
        except StepError as exc:  # GateFailed (a swapped file) or a missing file or record
            refused[version] = str(exc)
    return digests, refused


def _refuse(version: int, path: Path, digest: str, size: int, source: str, recorded: str, recorded_size: Any) -> None:
    recorded_bytes = f"{int(recorded_size)} bytes" if recorded_size is not None else "size not recorded"
    raise GateFailed(
        f"v{version} {MODEL_FILE} at {path} has sha256 {digest[:_SHOWN]}… ({size} bytes) on disk, {source} "
        f"{recorded[:_SHOWN]}… ({recorded_bytes}): the file that would be served is not the file that was checked"
    )


# --- the graph against the config that serves it ------------------------------------------------------


def one_line(exc: BaseException) -> str:
    """An exception as one short line (onnx and onnxruntime messages span lines): its type and first 300 chars."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}{'…' if len(text) > 300 else ''}"


def _type_name(onnx_elem_type: int) -> str:
    """An ONNX element type in Triton's spelling (FP32, INT64, …), so a message compares like with like."""
    from onnx import TensorProto

    names: dict[int, str] = {
        TensorProto.FLOAT: "FP32",
        TensorProto.DOUBLE: "FP64",
        TensorProto.FLOAT16: "FP16",
        TensorProto.INT64: "INT64",
        TensorProto.INT32: "INT32",
        TensorProto.BOOL: "BOOL",
        TensorProto.STRING: "BYTES",
    }
    return names.get(onnx_elem_type) or str(TensorProto.DataType.Name(onnx_elem_type))


def declared_tensors(config: mc.ModelConfig) -> tuple[Tensors, Tensors]:
    """(inputs, outputs) a config declares, as name → (type, full shape with the batch dimension, -1 = any)."""
    from tritonclient.grpc import model_config_pb2 as mc

    batch = [-1] if config.max_batch_size > 0 else []

    def full(tensor: Any) -> tuple[str, list[int]]:
        dims = list(tensor.reshape.shape) if tensor.HasField("reshape") else list(tensor.dims)
        return mc.DataType.Name(tensor.data_type).removeprefix("TYPE_"), batch + [int(d) for d in dims]

    return {t.name: full(t) for t in config.input}, {t.name: full(t) for t in config.output}


def _graph_tensor(value_info: Any) -> tuple[str, list[int]] | None:
    """(type, shape) of a graph input/output; a symbolic or unset dimension is -1; None when it has no shape."""
    tensor = value_info.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return _type_name(tensor.elem_type), [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim]


def _fmt(found: tuple[str, list[int]]) -> str:
    return f"{found[0]} {found[1]}"


def graph_problems(model_bytes: bytes, config: mc.ModelConfig) -> list[str]:
    """Why these ONNX bytes cannot be served under `config` (empty when they can): checker, strict shapes, contract."""
    import onnx

    try:
        model = onnx.load_from_string(model_bytes)
    except Exception as exc:  # protobuf DecodeError and friends: not an ONNX model at all
        return [f"not a readable ONNX model ({one_line(exc)})"]
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # ValidationError, InferenceError
        return [f"ONNX checker refused the graph ({one_line(exc)})"]
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as exc:
        return [f"strict shape inference refused the graph ({one_line(exc)})"]
    inputs, outputs = declared_tensors(config)
    initializers = {i.name for i in model.graph.initializer}
    found_inputs = {i.name: _graph_tensor(i) for i in model.graph.input if i.name not in initializers}
    found_outputs = {o.name: _graph_tensor(o) for o in model.graph.output}
    return _compare("input", inputs, found_inputs) + _compare("output", outputs, found_outputs)


def _compare(kind: str, declared: Tensors, found: dict[str, tuple[str, list[int]] | None]) -> list[str]:
    problems = []
    for name, want in declared.items():
        if name not in found:
            problems.append(f"{kind} {name}: expected {_fmt(want)}, found no such graph {kind}")
        elif found[name] is None:
            problems.append(f"{kind} {name}: expected {_fmt(want)}, found a tensor of unknown shape")
        elif found[name] != want:
            problems.append(f"{kind} {name}: expected {_fmt(want)}, found {_fmt(found[name])}")  # type: ignore[arg-type]
    # Exactly what the config declares: an undeclared tensor means the graph is not the one the config describes.
    problems += [f"graph {kind} {name} is not declared in the config" for name in found if name not in declared]
    return problems
