"""NetworkPolicies: deny everything in the namespace, then allow exactly the flows the release needs."""

from __future__ import annotations

from typing import Any

from mlrelease.deploy.meta import STEP_POD_SELECTOR, metadata, selector
from mlrelease.deploy.values import DeployValues, Peer

COMPONENT = "network"
DNS_PROTOCOLS = ("UDP", "TCP")  # DNS answers that do not fit a UDP datagram are retried over TCP


def peer_selectors(peer: Peer) -> list[dict[str, Any]]:
    """NetworkPolicyPeer entries for a peer: ipBlocks, or pods (by labels) in its namespace or the release's."""
    if peer.cidrs:
        return [{"ipBlock": {"cidr": cidr}} for cidr in peer.cidrs]
    entry: dict[str, Any] = {"podSelector": {"matchLabels": dict(peer.podLabels)}}
    if peer.namespace is not None:
        entry["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": peer.namespace}}
    return [entry]


def tcp(*ports: int) -> list[dict[str, Any]]:
    """NetworkPolicyPorts for TCP ports."""
    return [{"protocol": "TCP", "port": port} for port in ports]


def _pods(labels: dict[str, str]) -> list[dict[str, Any]]:
    return [{"podSelector": {"matchLabels": dict(labels)}}]


def _to(peer: Peer) -> dict[str, Any]:
    return {"to": peer_selectors(peer), "ports": tcp(*peer.ports)}


def _dns(values: DeployValues) -> dict[str, Any]:
    dns = values.network.dns
    return {
        "to": peer_selectors(dns),
        "ports": [{"protocol": proto, "port": port} for port in dns.ports for proto in DNS_PROTOCOLS],
    }


def _policy(values: DeployValues, name: str, pods: dict[str, str], kind: str, rules: list[dict[str, Any]]) -> dict:
    field = "ingress" if kind == "Ingress" else "egress"
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(name, values.namespace, COMPONENT),
        "spec": {"podSelector": {"matchLabels": dict(pods)}, "policyTypes": [kind], field: rules},
    }


def default_deny(values: DeployValues) -> dict[str, Any]:
    """Every pod in the namespace: no ingress, no egress, unless a policy below allows it."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata("default-deny-all", values.namespace, COMPONENT),
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    }


def gateway_policies(values: DeployValues) -> list[dict[str, Any]]:
    """Gateway ← clients and Prometheus on its port; gateway → Triton HTTP, Redis, Feast (online + registry), DNS."""
    gw, net = values.gateway, values.network
    clients = [entry for peer in net.gatewayClients for entry in peer_selectors(peer)]
    ingress = [
        {"from": clients, "ports": tcp(gw.port)},
        {"from": peer_selectors(net.prometheus), "ports": tcp(gw.port)},  # /metrics is on the same port
    ]
    if _route_to_gateways(values) and net.routeDataPlane is not None:  # the HTTPRoute's backends are the arm gateways
        ingress.append({"from": peer_selectors(net.routeDataPlane), "ports": tcp(gw.port)})
    egress = [
        {"to": _pods(selector(values.triton.name)), "ports": tcp(values.triton.ports.http)},
        _to(net.redis),  # routing state
        _to(net.feastOnlineStore),  # feature lookups
        _to(net.feastRegistry),  # the feature views the lookups read (Feast's SQL registry)
        _dns(values),
    ]
    pods = selector(gw.name)
    return [
        _policy(values, f"{gw.name}-ingress", pods, "Ingress", ingress),
        _policy(values, f"{gw.name}-egress", pods, "Egress", egress),
    ]


def _route_to_gateways(values: DeployValues) -> bool:
    return values.routing.mode == "httproute" and values.routing.httpRoute.backends == "gateways"


def triton_policies(values: DeployValues) -> list[dict[str, Any]]:
    """Triton ← gateway (HTTP), step pods (HTTP: load, unload, validate, perf_analyzer), Prometheus (metrics),
    and in httproute mode the Gateway API data plane (HTTP).

    Triton itself opens no connections: the default deny covers its egress.
    """
    triton = values.triton
    ingress = [
        {"from": _pods(selector(values.gateway.name)), "ports": tcp(triton.ports.http)},
        {"from": _pods(STEP_POD_SELECTOR), "ports": tcp(triton.ports.http)},
        {"from": peer_selectors(values.network.prometheus), "ports": tcp(triton.ports.metrics)},
    ]
    data_plane = values.network.routeDataPlane
    if values.routing.mode == "httproute" and not _route_to_gateways(values) and data_plane is not None:  # to Triton
        ingress.append({"from": peer_selectors(data_plane), "ports": tcp(triton.ports.http)})
    return [_policy(values, f"{triton.name}-ingress", selector(triton.name), "Ingress", ingress)]


def step_policies(values: DeployValues) -> list[dict[str, Any]]:
    """Step pods → Triton, Redis, MLflow, Feast (online store, registry), DNS (+ Pushgateway, + Prometheus when it is
    the metrics source, + API in httproute mode).

    Nothing connects to a step pod: Airflow reads its log and XCom through the API server, not the pod network.
    """
    net = values.network
    egress = [
        {"to": _pods(selector(values.triton.name)), "ports": tcp(values.triton.ports.http)},
        _to(net.redis),  # the gateway routing state the rollout steps write
        _to(net.mlflow),  # tracking and registry (artifacts proxied by the tracking server)
        _to(net.feastOnlineStore),  # materialize writes the online store
        _to(net.feastRegistry),  # apply writes, every Feast step reads Feast's SQL registry
        _dns(values),
    ]
    if net.pushgateway is not None:  # check-freshness pushes its gauges when MLRELEASE_PUSHGATEWAY_URL is set
        egress.append(_to(net.pushgateway))
    if values.monitoring.metricsSource == "prometheus":  # analyze reads the guardrails' evidence with PromQL
        egress.append({"to": peer_selectors(net.prometheus), "ports": tcp(values.monitoring.prometheusPort)})
    if values.routing.mode == "httproute" and net.kubernetesApi is not None:  # patch the HTTPRoute
        egress.append(_to(net.kubernetesApi))
    return [_policy(values, "mlrelease-steps-egress", STEP_POD_SELECTOR, "Egress", egress)]


def network_policies(values: DeployValues) -> list[dict[str, Any]]:
    """The default deny and every allowed flow."""
    return [default_deny(values), *gateway_policies(values), *triton_policies(values), *step_policies(values)]
