"""The process model's input contract: which Feast features, in which order, encoded how (training and steps).

All of it is the model's release spec (models/<name>/release.yaml, `features:`), read once per process; the
encoding itself is model/feature_codec.py, which a process serving several models uses per model instead.
"""

from __future__ import annotations

from mlrelease.model.feature_codec import FeatureCodec
from mlrelease.release_spec import process_spec

_FEATURES = process_spec().features
_CODEC = FeatureCodec(_FEATURES)
FEATURE_SERVICE = _FEATURES.service
TARGET = _FEATURES.label.column
ENTITY_KEYS = _FEATURES.entity_keys
VOCABULARIES: dict[str, tuple[str, ...]] = _CODEC.vocabularies
# Model input columns, in ONNX input order. Changing this list changes the model's input schema.
FEATURES: tuple[str, ...] = _CODEC.columns
encode = _CODEC.encode
encode_row = _CODEC.encode_row
