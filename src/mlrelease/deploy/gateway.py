"""The prediction gateway: its config, Deployment, Service, PodDisruptionBudget and HorizontalPodAutoscaler."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import yaml

from mlrelease.deploy.gateway_config import CONFIG_DIR, CONFIG_KEY, KEYS_DIR
from mlrelease.deploy.meta import (
    STATE_MOUNT,
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
from mlrelease.gateway.config import GatewayConfig

COMPONENT = "gateway"
ARMS = ("stable", "candidate")
ARM_LABEL = "mlrelease.io/arm"  # behind an HTTPRoute that assigns users: which arm a gateway pod serves


def config_text(config: GatewayConfig) -> str:
    """The gateway YAML the ConfigMap carries."""
    header = "# Rendered by `mlrelease deploy render` from the repo's gateway config and deploy values.\n"
    return header + yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


@dataclass(frozen=True)
class Workload:
    """One set of gateway pods: its objects' name, its pods' selector labels, its ConfigMap and config."""

    name: str
    select: dict[str, str]
    config_map: str
    config: GatewayConfig


def workloads(values: DeployValues, config: GatewayConfig) -> list[Workload]:
    """The gateway pods: one Deployment that splits users itself, or, behind an HTTPRoute that assigns them
    (`routing.httpRoute.backends: gateways`), one per arm (stable, candidate), each judging its requests in its arm."""
    gw = values.gateway
    if values.routing.mode != "httproute" or values.routing.httpRoute.backends != "gateways":
        return [Workload(gw.name, selector(gw.name), gw.configMap, config)]
    return [
        Workload(
            f"{gw.name}-{arm}",
            {**selector(gw.name), ARM_LABEL: arm},
            f"{gw.configMap}-{arm}",
            config.model_copy(update={"routing": config.routing.model_copy(update={"arm": arm})}),
        )
        for arm in ARMS
    ]


def config_map(values: DeployValues, config: GatewayConfig) -> dict[str, Any]:
    """The ConfigMap holding the gateway config (the steps mount it too: in httproute mode it carries the router's)."""
    gw = values.gateway
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(gw.configMap, values.namespace, COMPONENT, gw.name),
        "data": {CONFIG_KEY: config_text(config), **_router_data(values, config)},
    }


def arm_config_map(values: DeployValues, workload: Workload) -> dict[str, Any]:
    """An arm's own gateway config (its `routing.arm`)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(workload.config_map, values.namespace, COMPONENT, values.gateway.name),
        "data": {CONFIG_KEY: config_text(workload.config)},
    }


def _router_data(values: DeployValues, config: GatewayConfig) -> dict[str, str]:
    # The rollout steps mount this ConfigMap too: in httproute mode it also carries the router's config.
    if values.routing.mode != "httproute":
        return {}
    from mlrelease.deploy import httproute

    return {httproute.CONFIG_KEY: httproute.router_config_text(httproute.router_config(values, config))}


def _container(values: DeployValues, config: GatewayConfig) -> dict[str, Any]:
    gw = values.gateway
    command = ["mlrelease", "gateway", "--config", f"{CONFIG_DIR}/{CONFIG_KEY}", "--host", "0.0.0.0"]
    command += ["--port", str(gw.port), "--workers", str(gw.workers)]
    return {
        "name": "gateway",
        "image": gw.image.reference,
        "imagePullPolicy": gw.image.pullPolicy,
        "command": command,
        "ports": [{"name": "http", "containerPort": gw.port, "protocol": "TCP"}],
        "env": [
            {"name": "MLRELEASE_HOME", "value": STATE_MOUNT},
            {"name": "MLRELEASE_ONLINE_STORE", "value": "redis"},
            {"name": "MLRELEASE_GATEWAY_CONFIG", "value": f"{CONFIG_DIR}/{CONFIG_KEY}"},
            {"name": "MLRELEASE_MODEL", "value": config.model},  # its default model (the only one, unless models:)
            {"name": "HOME", "value": "/tmp"},  # Feast writes small caches under HOME; the root is read-only
        ],
        # MLRELEASE_REDIS_URL (the Feast online store, host:port[,password=…]) comes from this Secret.
        "envFrom": [{"secretRef": {"name": gw.envSecret}}],
        "resources": resources(gw.resources),
        "securityContext": container_security(),
        "startupProbe": startup_probe("/healthz", "http", gw.probes.startup, gw.startupBudgetSeconds),
        # /readyz: a routing state is known (answers come from the model, or from the rule while Triton is down).
        "readinessProbe": http_probe("/readyz", "http", gw.probes.readiness),
        "livenessProbe": http_probe("/healthz", "http", gw.probes.liveness),
        "volumeMounts": [
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "keys", "mountPath": KEYS_DIR, "readOnly": True},
            {"name": "state", "mountPath": STATE_MOUNT},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def deployment(values: DeployValues, workload: Workload) -> dict[str, Any]:
    """The gateway Deployment: non-root, read-only root, no capabilities, spread over nodes."""
    gw, config = values.gateway, workload.config
    # A config change must roll the pods: the gateway reads its config only at start-up.
    digest = hashlib.sha256(config_text(config).encode()).hexdigest()
    spec: dict[str, Any] = {
        "revisionHistoryLimit": 5,
        "selector": {"matchLabels": workload.select},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "template": {
            "metadata": {
                "labels": {**labels(gw.name, COMPONENT), **workload.select},
                "annotations": {"mlrelease.io/gateway-config-sha256": digest},
            },
            "spec": {
                "serviceAccountName": gw.serviceAccount,
                "automountServiceAccountToken": False,
                "securityContext": pod_security(values),
                "terminationGracePeriodSeconds": 30,
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {"matchLabels": workload.select},
                    }
                ],
                "containers": [_container(values, config)],
                "volumes": [
                    {"name": "config", "configMap": {"name": workload.config_map}},
                    {"name": "keys", "secret": {"secretName": gw.keysSecret, "defaultMode": 0o440}},
                    {"name": "state", "persistentVolumeClaim": {"claimName": values.state.claimName}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
                ],
            },
        },
    }
    if not gw.autoscaling.enabled:  # with an HPA the replica count is its business; applying one would fight it
        spec["replicas"] = gw.replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(workload.name, values.namespace, COMPONENT, gw.name),
        "spec": spec,
    }


def service(values: DeployValues, workload: Workload) -> dict[str, Any]:
    """The gateway's ClusterIP Service (put an Ingress or Gateway in front of it; per arm, the HTTPRoute's backend)."""
    gw = values.gateway
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(workload.name, values.namespace, COMPONENT, gw.name),
        "spec": {
            "type": "ClusterIP",
            "selector": workload.select,
            "ports": [{"name": "http", "port": gw.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def disruption_budget(values: DeployValues, workload: Workload) -> list[dict[str, Any]]:
    """The PodDisruptionBudget, when enabled."""
    gw = values.gateway
    if not gw.podDisruptionBudget.enabled:
        return []
    return [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": metadata(workload.name, values.namespace, COMPONENT, gw.name),
            "spec": {
                "maxUnavailable": gw.podDisruptionBudget.maxUnavailable,
                "selector": {"matchLabels": workload.select},
                # A crash-looping pod must not block node drains.
                "unhealthyPodEvictionPolicy": "AlwaysAllow",
            },
        }
    ]


def autoscaler(values: DeployValues, workload: Workload) -> list[dict[str, Any]]:
    """The HorizontalPodAutoscaler (autoscaling/v2, CPU utilisation), when enabled."""
    gw = values.gateway
    scaling = gw.autoscaling
    if not scaling.enabled:
        return []
    return [
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": metadata(workload.name, values.namespace, COMPONENT, gw.name),
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": workload.name},
                "minReplicas": scaling.minReplicas,
                "maxReplicas": scaling.maxReplicas,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {
                                "type": "Utilization",
                                "averageUtilization": scaling.targetCPUUtilizationPercentage,
                            },
                        },
                    }
                ],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 300}},
            },
        }
    ]


def gateway(values: DeployValues, config: GatewayConfig) -> list[dict[str, Any]]:
    """Every gateway object: the config the steps mount too, then each workload's (one, or one per arm)."""
    objects = [config_map(values, config)]
    for workload in workloads(values, config):
        if workload.config_map != values.gateway.configMap:
            objects.append(arm_config_map(values, workload))
        objects += [
            deployment(values, workload),
            service(values, workload),
            *disruption_budget(values, workload),
            *autoscaler(values, workload),
        ]
    return objects
