"""The HTTPRoute mode on the cluster: the router's config (a ConfigMap key) and the route as first created."""

from __future__ import annotations

from typing import Any

import yaml

from mlrelease.deploy.gateway_config import triton_url
from mlrelease.deploy.values import DeployValues
from mlrelease.gateway.config import GatewayConfig
from mlrelease.registry import MODEL_NAME
from mlrelease.rollout.httproute import HTTPRouteConfig, route_manifest
from mlrelease.rollout.traffic_router import Routing

CONFIG_KEY = "httproute.yaml"


def router_config(values: DeployValues, gateway_config: GatewayConfig) -> HTTPRouteConfig:
    """What the rollout steps need to drive the route, from the same values that render its RBAC."""
    route = values.routing.httpRoute
    return HTTPRouteConfig(
        name=route.name,
        namespace=values.route_namespace,
        model=MODEL_NAME,
        parent_gateway=route.parentGateway.name,
        parent_namespace=route.parentGateway.namespace,
        section_name=route.parentGateway.sectionName,
        hostnames=route.hostnames,
        backend_service=values.triton.name,
        backend_port=values.triton.ports.http,
        cohort_header=route.cohortHeader,
        # Each cohort the gateway config names gets its own rule, so the plan's per-cohort shares hold.
        cohorts=gateway_config.cohorts.names,
        triton_url=triton_url(values),
        accept_timeout_s=route.acceptTimeoutSeconds,
        backends=route.backends,
        stable_service=f"{values.gateway.name}-stable",  # deploy/gateway.py's arm workloads
        candidate_service=f"{values.gateway.name}-candidate",
        gateway_port=values.gateway.port,
        bucket_header=route.bucketHeader,
    )


def router_config_text(config: HTTPRouteConfig) -> str:
    """The router config YAML the step pods read (MLRELEASE_HTTPROUTE_CONFIG)."""
    header = "# Rendered by `mlrelease deploy render` (routing.mode: httproute).\n"
    return header + yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def initial_route(values: DeployValues, gateway_config: GatewayConfig) -> dict[str, Any]:
    """The HTTPRoute with all traffic on `initialStableVersion`: create it once; the rollout owns it afterwards."""
    config = router_config(values, gateway_config)
    version = values.routing.httpRoute.initialStableVersion
    return route_manifest(config, Routing(stable_version=version), reason="created by mlrelease deploy render")
