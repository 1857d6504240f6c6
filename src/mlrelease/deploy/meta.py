"""Pieces every manifest shares: labels, selectors, metadata, the restricted security contexts, probes."""

from __future__ import annotations

from typing import Any

from mlrelease.deploy.values import STEP_POD_NAME, DeployValues, Probe, Resources, StartupProbe

PART_OF = "mlrelease"
MANAGED_BY = "mlrelease-deploy"
STATE_MOUNT = "/var/lib/mlrelease"  # = plugins/mlrelease_airflow/pod_spec.py STATE_MOUNT (MLRELEASE_HOME)
# The labels plugins/mlrelease_airflow/kubernetes.py puts on every step pod (component = the step's name).
STEP_POD_SELECTOR = {"app.kubernetes.io/name": STEP_POD_NAME}


def selector(name: str) -> dict[str, str]:
    """The labels a workload's pods are selected by."""
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": PART_OF}


def labels(name: str, component: str) -> dict[str, str]:
    """Recommended labels for an object of `component`, including its selector labels."""
    return {**selector(name), "app.kubernetes.io/component": component, "app.kubernetes.io/managed-by": MANAGED_BY}


def metadata(name: str, namespace: str | None, component: str, app: str = PART_OF) -> dict[str, Any]:
    """ObjectMeta with the recommended labels (no namespace for cluster-scoped objects)."""
    meta: dict[str, Any] = {"name": name, "labels": labels(app, component)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def pod_security(values: DeployValues, uid: int | None = None) -> dict[str, Any]:
    """Pod-level context of the restricted Pod Security profile; one fsGroup for everything on the state volume."""
    user = uid or values.runAsUser
    return {
        "runAsNonRoot": True,
        "runAsUser": user,
        "runAsGroup": user,
        "fsGroup": values.runAsUser,
        "fsGroupChangePolicy": "OnRootMismatch",  # the shared volume is not re-chowned on every mount
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security() -> dict[str, Any]:
    """Container-level context of the restricted profile (same as the step pods')."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def http_probe(path: str, port: str, timing: Probe) -> dict[str, Any]:
    """A readiness or liveness HTTP probe."""
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": timing.periodSeconds,
        "timeoutSeconds": timing.timeoutSeconds,
        "failureThreshold": timing.failureThreshold,
        "initialDelaySeconds": timing.initialDelaySeconds,
    }


def startup_probe(path: str, port: str, timing: StartupProbe, budget_s: int) -> dict[str, Any]:
    """A startup HTTP probe that keeps liveness off for at least `budget_s` seconds."""
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": timing.periodSeconds,
        "timeoutSeconds": timing.timeoutSeconds,
        "failureThreshold": timing.threshold(budget_s),
    }


def resources(spec: Resources, extra: dict[str, str] | None = None) -> dict[str, Any]:
    """A ResourceRequirements object; `extra` (e.g. GPUs) goes into both requests and limits."""
    requests = {str(name): value for name, value in spec.requests.items()} | (extra or {})
    limits = {str(name): value for name, value in spec.limits.items()} | (extra or {})
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out
