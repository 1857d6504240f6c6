"""Least-privilege RBAC: Airflow may run step pods; step pods may touch only their own HTTPRoute; nothing else."""

from __future__ import annotations

from typing import Any

from mlrelease.deploy.meta import metadata
from mlrelease.deploy.values import DeployValues

GATEWAY_API_GROUP = "gateway.networking.k8s.io"

# What the KubernetesPodOperator does in the step namespace (provider cncf-kubernetes 10.x): create the pod,
# find it again by labels, watch it, patch a label on it when done, delete it; read its log; exec into the
# XCom sidecar to read /airflow/xcom/return.json; list events to explain a pod that failed to start.
POD_LAUNCHER_RULES: list[dict[str, Any]] = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "watch"]},
]


def _binding(name: str, namespace: str, role: str, subjects: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": metadata(name, namespace, "rbac"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
        "subjects": subjects,
    }


def _role(name: str, namespace: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": metadata(name, namespace, "rbac"),
        "rules": rules,
    }


def airflow_pod_launcher(values: DeployValues) -> list[dict[str, Any]]:
    """Role + RoleBinding letting the Airflow workers run step pods in the step namespace, and nothing more."""
    name = "mlrelease-airflow-pod-launcher"
    subjects = [
        {"kind": "ServiceAccount", "name": account, "namespace": values.airflow.namespace}
        for account in values.airflow.serviceAccounts
    ]
    return [
        _role(name, values.namespace, [dict(rule) for rule in POD_LAUNCHER_RULES]),
        _binding(name, values.namespace, name, subjects),
    ]


def step_route_access(values: DeployValues) -> list[dict[str, Any]]:
    """httproute mode: the step SA may get and patch the one HTTPRoute it steers. Gateway mode: no API access."""
    if values.routing.mode != "httproute":
        return []
    route = values.routing.httpRoute
    name = "mlrelease-step-httproute"
    rules = [
        {
            "apiGroups": [GATEWAY_API_GROUP],
            "resources": ["httproutes"],
            "resourceNames": [route.name],
            "verbs": ["get", "patch"],
        }
    ]
    subject = {"kind": "ServiceAccount", "name": values.steps.serviceAccount, "namespace": values.namespace}
    return [
        _role(name, values.route_namespace, rules),
        _binding(name, values.route_namespace, name, [subject]),
    ]


def rbac(values: DeployValues) -> list[dict[str, Any]]:
    """Every Role and RoleBinding of the release (the gateway and Triton get none)."""
    return airflow_pod_launcher(values) + step_route_access(values)
