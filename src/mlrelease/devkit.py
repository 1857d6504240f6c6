"""Building blocks for tests, benchmarks and drills that run the real components without the whole DAG.

A quick model trained straight from the generated parquet (no Feast, no MLflow), and a model repository
staged with chosen versions (good or faulty), ready for the local Triton server.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from mlrelease.model.estimator import EtaModel
from mlrelease.model.features import FEATURES, TARGET, encode
from mlrelease.model.onnx_export import OUTPUTS
from mlrelease.registry import MODEL_NAME
from mlrelease.serving.cpu_repo import sync_cpu_repository
from mlrelease.serving.triton_repo import ServingConfig, build_config, write_config, write_version


def training_frame(offline_dir: Path) -> pd.DataFrame:
    """Every generated order joined to its package and to the latest user and route snapshot."""

    def read(table: str) -> pd.DataFrame:
        return pd.read_parquet(offline_dir / table).drop(columns=["date"], errors="ignore")

    def latest(table: str, key: str) -> pd.DataFrame:
        frame = read(table).sort_values("event_timestamp").drop_duplicates(key, keep="last")
        return frame.drop(columns="event_timestamp")

    frame = read("orders").merge(read("packages").drop(columns="event_timestamp"), on="package_id")
    return frame.merge(latest("routes", "route_id"), on="route_id").merge(latest("users", "user_id"), on="user_id")


def quick_model(offline_dir: Path, max_iter: int = 200) -> tuple[EtaModel, np.ndarray]:
    """An EtaModel fitted on the generated orders, and the encoded feature matrix it saw."""
    frame = training_frame(offline_dir)
    X = encode(frame[list(FEATURES)])
    return EtaModel(max_iter=max_iter).fit(X, frame[TARGET].to_numpy()), X


def stage_repository(production_root: Path, cpu_root: Path, versions: dict[int, bytes]) -> None:
    """Publish the given versions and a config serving all of them, then mirror it for the CPU server."""
    for version, model_bytes in versions.items():
        write_version(production_root, MODEL_NAME, version, model_bytes, {"source": "devkit"})
    config = build_config(MODEL_NAME, len(FEATURES), OUTPUTS, sorted(versions), ServingConfig())
    write_config(production_root, config)
    sync_cpu_repository(production_root, cpu_root, MODEL_NAME)
