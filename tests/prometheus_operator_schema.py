"""Validate Prometheus Operator objects (PodMonitor, PrometheusRule) against the operator's CRD schemas."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

TOOLS = Path(__file__).parent / "tools"
SCRIPT = TOOLS / "validate-prometheus-operator.mjs"


def validate_prometheus_operator(objects: list[dict[str, Any]]) -> list[str | None]:
    """Per object: None when it is a valid monitoring.coreos.com/v1 object, else the schema's complaint."""
    node = shutil.which("node")
    if node is None or not (TOOLS / "node_modules" / "@kubernetes-models" / "prometheus-operator").is_dir():
        raise RuntimeError("the Prometheus Operator validator is not installed: `make test` runs npm ci in tests/tools")
    proc = subprocess.run(
        [node, str(SCRIPT)], input=json.dumps(objects), capture_output=True, text=True, check=True, timeout=60
    )
    return list(json.loads(proc.stdout))
