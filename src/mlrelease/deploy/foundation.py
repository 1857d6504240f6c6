"""The namespace, the shared state volume and the workloads' service accounts."""

from __future__ import annotations

from typing import Any

from mlrelease.deploy.meta import metadata
from mlrelease.deploy.values import DeployValues


def namespace(values: DeployValues) -> dict[str, Any]:
    """The release namespace, enforcing a Pod Security level (restricted by default)."""
    meta = metadata(values.namespace, None, "namespace")
    for mode in ("enforce", "audit", "warn"):
        meta["labels"][f"pod-security.kubernetes.io/{mode}"] = values.podSecurity
        meta["labels"][f"pod-security.kubernetes.io/{mode}-version"] = "latest"
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def state_claim(values: DeployValues) -> list[dict[str, Any]]:
    """The state PVC (MLRELEASE_HOME of steps and gateway, Triton's model repository), unless it exists already."""
    state = values.state
    if not state.create:
        return []
    spec: dict[str, Any] = {"accessModes": [state.accessMode], "resources": {"requests": {"storage": state.size}}}
    if state.storageClassName is not None:
        spec["storageClassName"] = state.storageClassName
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": metadata(state.claimName, values.namespace, "state"),
            "spec": spec,
        }
    ]


def service_accounts(values: DeployValues) -> list[dict[str, Any]]:
    """One service account per workload, none of which mounts an API token by default."""
    accounts = (
        (values.steps.serviceAccount, "step"),
        (values.gateway.serviceAccount, "gateway"),
        (values.triton.serviceAccount, "triton"),
    )
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": metadata(name, values.namespace, component),
            # Pods that need the API (step pods in httproute mode) opt in on the pod, not here.
            "automountServiceAccountToken": False,
        }
        for name, component in accounts
    ]
