"""Prometheus Operator objects: a PodMonitor per scraped workload (gateway, Triton) and the alerting rules.

They are rendered apart (`OUT/monitoring/`): they need the Prometheus Operator's CRDs, which the core Kubernetes schema
`deploy render` validates against does not know; the tests validate them against the operator's own CRD schemas and
the rules with promtool.
"""

from __future__ import annotations

from typing import Any

import yaml

from mlrelease.deploy.meta import metadata, selector
from mlrelease.deploy.values import DeployValues
from mlrelease.settings import REPO_ROOT

API_VERSION = "monitoring.coreos.com/v1"
RULES_FILE = REPO_ROOT / "deploy" / "monitoring" / "prometheus" / "alerts.yaml"
# The job names the alerts and the dashboard use (deploy/monitoring/README.md, "Scrape configuration").
GATEWAY_JOB, TRITON_JOB = "mlrelease-gateway", "triton"


def _meta(values: DeployValues, name: str) -> dict[str, Any]:
    meta = metadata(name, values.namespace, "monitoring")
    meta["labels"] = {**meta["labels"], **values.monitoring.labels}
    return meta


def pod_monitor(values: DeployValues, workload: str, port: str, job: str) -> dict[str, Any]:
    """A PodMonitor scraping `port`'s /metrics on every pod of `workload`, its series under the job `job`."""
    return {
        "apiVersion": API_VERSION,
        "kind": "PodMonitor",
        "metadata": _meta(values, workload),
        "spec": {
            "selector": {"matchLabels": selector(workload)},
            "podMetricsEndpoints": [
                {
                    "port": port,
                    "path": "/metrics",
                    "interval": values.monitoring.scrapeInterval,
                    "relabelings": [{"action": "replace", "targetLabel": "job", "replacement": job}],
                }
            ],
        },
    }


def prometheus_rule(values: DeployValues) -> dict[str, Any]:
    """deploy/monitoring/prometheus/alerts.yaml's groups, unchanged, as a PrometheusRule."""
    groups = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))["groups"]
    return {
        "apiVersion": API_VERSION,
        "kind": "PrometheusRule",
        "metadata": _meta(values, "mlrelease"),
        "spec": {"groups": groups},
    }


def monitoring_objects(values: DeployValues) -> list[dict[str, Any]]:
    """The monitoring objects the values ask for."""
    wanted = values.monitoring
    objects = []
    if wanted.podMonitors:
        objects += [
            pod_monitor(values, values.gateway.name, "http", GATEWAY_JOB),
            pod_monitor(values, values.triton.name, "metrics", TRITON_JOB),
        ]
    if wanted.prometheusRule:
        objects.append(prometheus_rule(values))
    return objects


def source_selector(values: DeployValues) -> str:
    """MLRELEASE_PROMETHEUS_SELECTOR for these values: the gateway's job in the release namespace."""
    return f'job="{GATEWAY_JOB}", namespace="{values.namespace}"'
