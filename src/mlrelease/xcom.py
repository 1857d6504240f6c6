"""The step result contract: a small JSON document at the KubernetesPodOperator XCom path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlrelease.storage import write_json_atomic


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write the step's result where the XCom sidecar (or the local runner) reads it."""
    write_json_atomic(path, result)
