"""What MLflow records about a model: signature and input example, the served ONNX bytes, the training window."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mlrelease.errors import StepError
from mlrelease.model import tracking
from mlrelease.model.estimator import EtaModel
from mlrelease.model.features import FEATURES, TARGET
from mlrelease.model.onnx_export import to_onnx
from mlrelease.timewindow import Window

pytestmark = pytest.mark.integration  # a real MLflow (SQLite) and a fitted model: ~20 s

WINDOW = Window.parse("2026-11-22T02:00:00+00:00", "2026-11-29T02:00:00+00:00")


@pytest.fixture(scope="module")
def fitted() -> tuple[EtaModel, np.ndarray]:
    rng = np.random.default_rng(0)
    X = rng.uniform(0, 10, size=(600, len(FEATURES))).astype("float32")
    X[0, 3] = np.nan  # a missing feature in the first row: the input example skips it
    return EtaModel(max_iter=20).fit(X, 10 + 2 * X[:, 1] + rng.normal(0, 1, len(X))), X


@pytest.fixture
def client(tmp_path: Path) -> Iterator[tuple[object, str]]:
    """A real MLflow tracking store (SQLite) in tmp_path and an experiment, as the process-wide target."""
    import mlflow
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    client = MlflowClient(uri, uri)
    try:
        yield client, client.create_experiment("t", artifact_location=(tmp_path / "artifacts").as_uri())
    finally:
        mlflow.set_tracking_uri(previous)
        mlflow.set_registry_uri(previous)


def test_input_example_is_small_and_complete():
    X = np.arange(40, dtype="float64").reshape(10, 4)
    X[0, 1] = np.nan
    example = tracking.input_example(X)
    assert example.shape == (5, 4) and example.dtype == np.float32
    assert np.isfinite(example).all() and example[0, 0] == 4.0  # the row with a NaN is not the example
    sparse = np.full((3, 2), np.nan)
    assert tracking.input_example(sparse).shape == (3, 2)  # no complete row: the first rows, as they are


def test_partitions_are_named_compactly():
    tags = tracking.partition_tags({"orders": ["2026-11-23", "2026-11-22"], "users": ["2026-11-22"], "routes": []})
    assert tags == {"partitions.orders": "date=2026-11-22..2026-11-23 (2)", "partitions.users": "date=2026-11-22 (1)"}
    assert tracking.dataset_name(WINDOW) == "parcel_eta_v1 2026-11-22T02:00:00+00:00/2026-11-29T02:00:00+00:00"


def test_registered_model_has_signature_example_window_and_onnx_copy(fitted, client, tmp_path):
    import mlflow
    from mlflow.models import Model

    model, X = fitted
    mlflow_client, experiment = client
    frame = pd.DataFrame(X, columns=list(FEATURES)).assign(**{TARGET: 1.0})
    with mlflow.start_run(experiment_id=experiment) as run:
        tracking.log_training_window(frame, WINDOW, "file:///state/data/offline/orders", {"orders": ["2026-11-22"]})
        info = tracking.log_native_model(model, X)
    version = int(mlflow.register_model(info.model_uri, "parcel_eta").version)

    registered = mlflow.models.get_model_info(f"models:/parcel_eta/{version}")
    assert registered.signature.inputs.to_dict() == [
        {"type": "tensor", "tensor-spec": {"dtype": "float32", "shape": (-1, len(FEATURES))}}
    ]
    local = mlflow.artifacts.download_artifacts(artifact_uri=f"models:/parcel_eta/{version}", dst_path=str(tmp_path))
    example = Model.load(local).load_input_example(local)
    np.testing.assert_array_equal(example, X[1:6])

    (dataset_input,) = mlflow_client.get_run(run.info.run_id).inputs.dataset_inputs
    assert dataset_input.dataset.name == tracking.dataset_name(WINDOW)
    assert json.loads(dataset_input.dataset.source) == {"uri": "file:///state/data/offline/orders"}
    assert dataset_input.dataset.source_type == "local"
    assert {t.key: t.value for t in dataset_input.tags}["mlflow.data.context"] == "training"

    served = to_onnx(model)
    digest = hashlib.sha256(served).hexdigest()
    assert tracking.find_onnx_model(mlflow_client, experiment, run.info.run_id, digest) is None
    with mlflow.start_run(run_id=run.info.run_id):
        onnx_info = tracking.log_onnx_model(mlflow_client, served, X[:256], version=version)
    assert tracking.logged_onnx_bytes(mlflow_client, onnx_info.model_id) == served
    found = tracking.find_onnx_model(mlflow_client, experiment, run.info.run_id, digest)
    assert found is not None and found.model_id == onnx_info.model_id
    assert found.tags["registered_model_version"] == str(version)
    loaded = mlflow.pyfunc.load_model(onnx_info.model_uri).predict(X[1:3])
    np.testing.assert_allclose(loaded["eta_prediction"].reshape(-1), model.predict(X[1:3]), atol=1e-3)


def test_a_logged_copy_that_differs_from_the_served_bytes_is_refused(fitted, client, monkeypatch):
    import mlflow

    model, X = fitted
    mlflow_client, experiment = client
    monkeypatch.setattr(tracking, "logged_onnx_bytes", lambda client, model_id: b"re-serialized")
    with mlflow.start_run(experiment_id=experiment), pytest.raises(StepError, match="is not the served file"):
        tracking.log_onnx_model(mlflow_client, to_onnx(model), X[:16], version=1)
