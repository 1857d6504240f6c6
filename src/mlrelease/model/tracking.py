"""What MLflow records about a model, as an MLflow user expects to find it.

- The registered (sklearn) model carries a signature and a small input example (`log_native_model`).
- The training window is a dataset input of the training run (`log_training_window`): a pandas dataset of the
  frame the model learnt from, named after the feature service and the window, with the orders table as source
  and the partitions read as input tags.
- The ONNX bytes Triton serves are a second logged model of the same run, with the `mlflow.onnx` flavor
  (`log_onnx_model`); the registered version points to it with tags (one model version has one source model).
  The logged copy is read back and must be byte-identical to the served file, whose SHA-256 the integrity
  check (serving.integrity) compares with the version's `onnx_sha256` tag.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from mlrelease.errors import StepError
from mlrelease.model.features import FEATURE_SERVICE, FEATURES, TARGET
from mlrelease.model.onnx_export import INPUT, OUTPUTS, run_onnx
from mlrelease.timewindow import Window

INPUT_EXAMPLE_ROWS = 5  # an input example documents the input; MLflow stores it as JSON next to the model
NATIVE_MODEL_NAME = "model"  # the logged sklearn model of a training run (the registered version's source)
ONNX_MODEL_NAME = "onnx"  # the logged ONNX model of the same run
ONNX_FILE = "model.onnx"  # the mlflow.onnx flavor's file name inside the logged model
# Tags: on the ONNX logged model (its bytes' digest, the version it serves) and on the model version (where it is).
ONNX_SHA256_TAG = "onnx_sha256"
ONNX_MODEL_ID_TAG = "onnx_model_id"
ONNX_MODEL_URI_TAG = "onnx_model_uri"
MODEL_VERSION_TAG = "registered_model_version"


def input_example(features: np.ndarray, rows: int = INPUT_EXAMPLE_ROWS) -> np.ndarray:
    """The first `rows` rows with every feature present (float32); the first rows when fewer are complete."""
    complete = features[np.isfinite(features).all(axis=1)]
    chosen = complete if len(complete) >= min(rows, len(features)) else features
    return np.ascontiguousarray(chosen[:rows], dtype=np.float32)


def _metadata() -> dict[str, Any]:
    """What a tensor signature cannot say: the order and meaning of the input columns."""
    return {"input_name": INPUT, "input_columns": list(FEATURES), "feature_service": FEATURE_SERVICE}


def log_native_model(model: Any, features: np.ndarray) -> Any:
    """Log the fitted model (sklearn flavor) with a signature and an input example; returns MLflow's ModelInfo.

    The model takes the encoded float32 matrix (model.features.encode), so the signature is a tensor spec
    [-1, len(FEATURES)] → the model's predict output; the column names and their order are in the model's metadata.
    """
    import mlflow.sklearn
    from mlflow.models import infer_signature

    example = input_example(features)
    signature = infer_signature(example, model.predict(example))
    return mlflow.sklearn.log_model(
        model,
        name=NATIVE_MODEL_NAME,
        serialization_format="cloudpickle",
        signature=signature,
        input_example=example,
        metadata=_metadata(),
    )


def partition_tags(partitions: dict[str, list[str]]) -> dict[str, str]:
    """Input tags naming the partitions read per table: `partitions.orders` → `date=2026-11-22..2026-11-29 (8)`."""
    tags = {}
    for table, days in sorted(partitions.items()):
        if days:
            ordered = sorted(days)
            span = ordered[0] if len(ordered) == 1 else f"{ordered[0]}..{ordered[-1]}"
            tags[f"partitions.{table}"] = f"date={span} ({len(ordered)})"
    return tags


def dataset_name(window: Window) -> str:
    """`parcel_eta_v1 2026-11-22T02:00:00+00:00/2026-11-29T02:00:00+00:00` (an ISO 8601 interval, end excluded)."""
    return f"{FEATURE_SERVICE} {window.start.isoformat()}/{window.end.isoformat()}"


def log_training_window(frame: pd.DataFrame, window: Window, source: str, partitions: dict[str, list[str]]) -> Any:
    """Log the frame the model was trained on as the active run's dataset input (context `training`).

    :param frame: the point-in-time frame of the window (labels, entity keys and features), before the split.
    :param window: the training window; it names the dataset.
    :param source: where the frame's rows come from (the orders table's file URI); Feast joins the features.
    :param partitions: table → the `YYYY-MM-DD` partitions of the window the frame was built from.
    """
    import mlflow
    from mlflow.data.dataset_source_registry import get_dataset_source_from_json
    from mlflow.data.pandas_dataset import from_pandas  # mlflow.data.from_pandas

    # The local-filesystem source by its type: resolving a file URI matches two registered classes (a warning).
    resolved = get_dataset_source_from_json(json.dumps({"uri": source}), source_type="local")
    dataset = from_pandas(frame, source=resolved, targets=TARGET, name=dataset_name(window))
    tags = {
        "window_start": window.start.isoformat(),
        "window_end": window.end.isoformat(),
        "feature_service": FEATURE_SERVICE,
        **partition_tags(partitions),
    }
    mlflow.log_input(dataset, context="training", tags=tags)
    return dataset


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def logged_onnx_bytes(client: Any, model_id: str) -> bytes:
    """The model.onnx file of a logged ONNX model, as stored in the artifact store."""
    import mlflow.artifacts

    location = client.get_logged_model(model_id).artifact_location.rstrip("/")
    with tempfile.TemporaryDirectory() as tmp:
        path = mlflow.artifacts.download_artifacts(artifact_uri=f"{location}/{ONNX_FILE}", dst_path=tmp)
        return Path(path).read_bytes()


def find_onnx_model(client: Any, experiment_id: str, run_id: str, digest: str) -> Any | None:
    """A READY ONNX model of `run_id` already logged with these bytes (a retried export logs none again)."""
    from mlflow.entities import LoggedModelStatus

    wanted = f"source_run_id = '{run_id}' AND name = '{ONNX_MODEL_NAME}' AND tags.{ONNX_SHA256_TAG} = '{digest}'"
    found = client.search_logged_models(experiment_ids=[experiment_id], filter_string=wanted)
    ready = [m for m in found if m.status == LoggedModelStatus.READY]
    return ready[0] if ready else None


def log_onnx_model(client: Any, model_bytes: bytes, sample: np.ndarray, *, version: int) -> Any:
    """Log the served ONNX bytes with the mlflow.onnx flavor in the active run; returns MLflow's ModelInfo.

    mlflow.onnx serializes the parsed graph again; the copy is read back from the artifact store and must be
    byte-identical to `model_bytes` (StepError otherwise), so loading it from MLflow gives what Triton serves.
    """
    import mlflow.onnx
    import onnx
    import onnxruntime
    from mlflow.models import infer_signature

    example = input_example(sample)
    outputs = {
        name: values.reshape(-1, 1) for name, values in zip(OUTPUTS, run_onnx(model_bytes, example), strict=True)
    }
    digest = _sha256(model_bytes)
    info = mlflow.onnx.log_model(
        onnx.load_from_string(model_bytes),
        name=ONNX_MODEL_NAME,
        signature=infer_signature(example, outputs),
        input_example=example,
        # One file, as Triton's model repository holds it (no external-data side files).
        save_as_external_data=False,
        # Stated, not inferred: inference would load the model in a subprocess for a list we know.
        pip_requirements=[f"onnx=={onnx.__version__}", f"onnxruntime=={onnxruntime.__version__}"],
        metadata=_metadata(),
        tags={ONNX_SHA256_TAG: digest, MODEL_VERSION_TAG: str(version)},
    )
    logged = _sha256(logged_onnx_bytes(client, info.model_id))
    if logged != digest:
        raise StepError(
            f"the mlflow.onnx copy of version {version} ({info.model_uri}) is not the served file: "
            f"sha256 {logged[:12]}… logged, {digest[:12]}… served"
        )
    return info
