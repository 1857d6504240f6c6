"""Validate Prometheus Operator objects (PodMonitor, PrometheusRule) against the operator's CRD schemas."""

from __future__ import annotations

from typing import Any

from tests.gateway_api_schema import TOOLS, run_validator

SCRIPT = TOOLS / "validate-prometheus-operator.mjs"


def validate_prometheus_operator(objects: list[dict[str, Any]]) -> list[str | None]:
    """Per object: None when it is a valid monitoring.coreos.com/v1 object, else the schema's complaint."""
    return run_validator(SCRIPT, "prometheus-operator", objects)
