"""One model's input encoding (its release spec's `features:`), as an object: several models in one process.

Training and the steps use the process model's codec through model/features.py; a gateway serving several
models holds one codec per model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from mlrelease.release_spec import Features


class FeatureCodec:
    """Encodes feature frames and request rows into a model's float32 input, in its ONNX input order.

    Categorical features become their index in a fixed vocabulary; an unknown value becomes -1 (tree models route
    it like any other value, and the gateway encodes the same way).

    :param features: the model's input contract from its release spec.
    """

    def __init__(self, features: Features) -> None:
        self.columns: tuple[str, ...] = features.columns
        self.vocabularies: dict[str, tuple[str, ...]] = dict(features.vocabularies)
        self._index = {name: {v: float(i) for i, v in enumerate(vocab)} for name, vocab in self.vocabularies.items()}
        # Per column: its vocabulary index, or None for a numeric column (one lookup per value in encode_row).
        self._plan = tuple((i, name, self._index.get(name)) for i, name in enumerate(self.columns))

    def encode(self, frame: pd.DataFrame) -> np.ndarray:
        """The float32 matrix [rows, len(columns)] the model takes; a missing column is a ValueError naming it."""
        missing = [c for c in self.columns if c not in frame.columns]
        if missing:
            raise ValueError(f"feature frame lacks columns {missing}")
        encoded = []
        for name in self.columns:
            values = frame[name]
            if name in self._index:
                encoded.append(values.map(self._index[name]).fillna(-1.0).to_numpy(dtype="float32"))
            else:
                encoded.append(pd.to_numeric(values, errors="coerce").astype("float64").to_numpy(dtype="float32"))
        return np.column_stack(encoded).astype("float32")

    def encode_row(self, values: Mapping[str, Any]) -> np.ndarray:
        """One request's float32 matrix [1, len(columns)], encoded exactly as `encode` encodes a frame.

        The gateway calls this per request; building a DataFrame there would cost more than the model call.
        A missing or None value becomes NaN (numeric) or -1 (categorical), as in `encode`.
        """
        row = np.empty((1, len(self.columns)), dtype="float32")
        for i, name, index in self._plan:
            value = values.get(name)
            if index is not None:
                row[0, i] = index.get(value, -1.0) if isinstance(value, str) else -1.0
            else:
                row[0, i] = np.nan if value is None else float(value)
        return row
