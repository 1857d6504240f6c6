"""The step result contract: a small JSON document at the KubernetesPodOperator XCom path."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mlrelease.storage import write_json_atomic


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write the step's result where the XCom sidecar (or the local runner) reads it, as strict JSON."""
    write_json_atomic(path, strict_json(result))


def strict_json(value: Any) -> Any:
    """`value` with every NaN or infinite float as null: JSON has no such numbers, and Airflow refuses to push an XCom
    that holds them (a band with no samples yet is NaN wide, e.g. a paused stage's evidence before any call)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(item) for item in value]
    return value
