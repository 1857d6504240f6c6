"""Triton on a GPU node: explicit model control over the model repository on the state volume.

A pod that dies is started again (restartPolicy Always; the liveness probe restarts a hung server), and a
restarted server loads the declared versions by itself: `--load-model` loads each listed model with the
versions its config.pbtxt's policy names, and every step that changes what is served writes that policy
first (see mlrelease.serving.reconcile). The local `mlrelease triton up` supervisor does the same.
"""

from __future__ import annotations

from typing import Any

from mlrelease.deploy.meta import (
    container_security,
    http_probe,
    labels,
    metadata,
    pod_security,
    resources,
    selector,
    startup_probe,
)
from mlrelease.deploy.values import DeployValues
from mlrelease.errors import StepError

COMPONENT = "inference"
MODEL_MOUNT = "/models"


def server_args(values: DeployValues) -> list[str]:
    """The container's args: `tritonserver` and its flags (the image's NGC entrypoint stays in front of them)."""
    triton = values.triton
    args = [
        "tritonserver",
        f"--model-repository={MODEL_MOUNT}",
        # The steps load and unload versions through the API; nothing loads by itself.
        "--model-control-mode=explicit",
        # A restarted server loads the declared versions again (the policy in each model's config.pbtxt).
        *(f"--load-model={model}" for model in triton.loadModels),
        # One bad candidate must not take the server (and the stable version) down.
        "--exit-on-error=false",
        # Non-strict: ready means the server answers; per-version readiness is what the gateway and steps check,
        # so a candidate that failed to load does not pull the stable version out of the Service.
        f"--strict-readiness={'true' if triton.strictReadiness else 'false'}",
        f"--http-port={triton.ports.http}",
        f"--grpc-port={triton.ports.grpc}",
        f"--metrics-port={triton.ports.metrics}",
    ]
    return args


def _container(values: DeployValues) -> dict[str, Any]:
    triton = values.triton
    gpus = str(triton.gpus)
    ports = triton.ports
    return {
        "name": "tritonserver",
        "image": triton.image.reference,
        "imagePullPolicy": triton.image.pullPolicy,
        # args, not command: the NGC entrypoint (CUDA compatibility set-up) must still run first.
        "args": server_args(values),
        "ports": [
            {"name": "http", "containerPort": ports.http, "protocol": "TCP"},
            {"name": "grpc", "containerPort": ports.grpc, "protocol": "TCP"},
            {"name": "metrics", "containerPort": ports.metrics, "protocol": "TCP"},
        ],
        "env": [{"name": "HOME", "value": "/tmp"}],
        # Extended resources: request and limit must be equal.
        "resources": resources(triton.resources, {"nvidia.com/gpu": gpus}),
        "securityContext": container_security(),
        # The HTTP endpoint answers only once the --load-model models are loaded: give that its whole budget.
        "startupProbe": startup_probe("/v2/health/ready", "http", triton.probes.startup, triton.modelLoadBudgetSeconds),
        "readinessProbe": http_probe("/v2/health/ready", "http", triton.probes.readiness),
        "livenessProbe": http_probe("/v2/health/live", "http", triton.probes.liveness),
        "volumeMounts": [
            {"name": "models", "mountPath": MODEL_MOUNT, "subPath": triton.modelRepositorySubPath, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "dshm", "mountPath": "/dev/shm"},  # python-backend stubs exchange tensors through shm
        ],
    }


def deployment(values: DeployValues) -> dict[str, Any]:
    """The Triton Deployment on a GPU node."""
    triton = values.triton
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(triton.name, values.namespace, COMPONENT, triton.name),
        "spec": {
            "replicas": triton.replicas,
            "revisionHistoryLimit": 5,
            "selector": {"matchLabels": selector(triton.name)},
            # A rolling update would need a second GPU free; recreate frees the one it has.
            "strategy": {"type": "Recreate"},
            "template": {
                "metadata": {"labels": labels(triton.name, COMPONENT)},
                "spec": {
                    "serviceAccountName": triton.serviceAccount,
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security(values, triton.runAsUser),
                    "terminationGracePeriodSeconds": 60,
                    "restartPolicy": "Always",  # the only one a Deployment allows; said here because it is relied on
                    "nodeSelector": dict(values.gpu.nodeSelector),
                    "tolerations": [{"key": values.gpu.tolerationKey, "operator": "Exists", "effect": "NoSchedule"}],
                    "containers": [_container(values)],
                    "volumes": [
                        {
                            "name": "models",
                            "persistentVolumeClaim": {"claimName": values.state.claimName, "readOnly": True},
                        },
                        {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": triton.shmSize}},
                    ],
                },
            },
        },
    }


def service(values: DeployValues) -> dict[str, Any]:
    """Triton's Service: HTTP, gRPC and metrics."""
    triton = values.triton
    ports = triton.ports
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(triton.name, values.namespace, COMPONENT, triton.name),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(triton.name),
            "ports": [
                {"name": "http", "port": ports.http, "targetPort": "http", "protocol": "TCP"},
                {"name": "grpc", "port": ports.grpc, "targetPort": "grpc", "protocol": "TCP"},
                {"name": "metrics", "port": ports.metrics, "targetPort": "metrics", "protocol": "TCP"},
            ],
        },
    }


def check_restart_serves(values: DeployValues, models: tuple[str, ...]) -> None:
    """A restarted Triton must load every model the gateway serves, or it comes back with nothing to answer with."""
    missing = [model for model in models if model not in values.triton.loadModels]
    if missing:
        raise StepError(
            f"triton.loadModels {list(values.triton.loadModels)} does not include {missing}, served by the gateway: "
            "a restarted Triton pod would come back without their declared versions"
        )


def triton(values: DeployValues, models: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Every Triton object; `models` (the gateway's) must be among those a restarted server loads."""
    check_restart_serves(values, models)
    return [deployment(values), service(values)]
