"""The model's input contract: which Feast features, in which order, encoded how (shared by training and serving)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from mlrelease.release_spec import process_spec

# All of it is the model's release spec (models/<name>/release.yaml, `features:`), read once per process.
_FEATURES = process_spec().features
FEATURE_SERVICE = _FEATURES.service
TARGET = _FEATURES.label.column
ENTITY_KEYS = _FEATURES.entity_keys
# Categorical features become their index in a fixed vocabulary; an unknown value becomes -1
# (tree models route it like any other value, and the gateway encodes the same way).
VOCABULARIES: dict[str, tuple[str, ...]] = dict(_FEATURES.vocabularies)
# Model input columns, in ONNX input order. Changing this list changes the model's input schema.
FEATURES: tuple[str, ...] = _FEATURES.columns


def encode(frame: pd.DataFrame) -> np.ndarray:
    """The float32 matrix [rows, len(FEATURES)] the model takes; a missing column is a ValueError naming it."""
    missing = [c for c in FEATURES if c not in frame.columns]
    if missing:
        raise ValueError(f"feature frame lacks columns {missing}")
    columns = []
    for name in FEATURES:
        values = frame[name]
        if name in VOCABULARIES:
            lookup = {v: float(i) for i, v in enumerate(VOCABULARIES[name])}
            columns.append(values.map(lookup).fillna(-1.0).to_numpy(dtype="float32"))
        else:
            columns.append(pd.to_numeric(values, errors="coerce").astype("float64").to_numpy(dtype="float32"))
    return np.column_stack(columns).astype("float32")


def encode_row(values: Mapping[str, Any]) -> np.ndarray:
    """One request's float32 matrix [1, len(FEATURES)], encoded exactly as `encode` encodes a frame.

    The gateway calls this per request; building a DataFrame there would cost more than the model call.
    A missing or None value becomes NaN (numeric) or -1 (categorical), as in `encode`.
    """
    row = np.empty((1, len(FEATURES)), dtype="float32")
    for i, name in enumerate(FEATURES):
        value = values.get(name)
        if name in VOCABULARIES:
            row[0, i] = _VOCAB_INDEX[name].get(value, -1.0) if isinstance(value, str) else -1.0
        else:
            row[0, i] = np.nan if value is None else float(value)
    return row


_VOCAB_INDEX: dict[str, dict[str, float]] = {
    name: {v: float(i) for i, v in enumerate(vocab)} for name, vocab in VOCABULARIES.items()
}
