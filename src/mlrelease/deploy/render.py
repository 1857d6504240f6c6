"""Values → manifests: assemble every object, validate them all, then (and only then) write them."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from mlrelease.deploy.foundation import namespace, service_accounts, state_claim
from mlrelease.deploy.gateway import gateway
from mlrelease.deploy.gateway_config import cluster_gateway_config
from mlrelease.deploy.kube_schema import KUBERNETES_VERSION, strict_validate
from mlrelease.deploy.network import network_policies
from mlrelease.deploy.rbac import rbac
from mlrelease.deploy.triton import triton
from mlrelease.deploy.values import DeployValues, load_values
from mlrelease.errors import StepError
from mlrelease.gateway.config import GatewayConfig


def render_objects(values: DeployValues, gateway_config: GatewayConfig) -> list[dict[str, Any]]:
    """Every manifest of the release, in apply order (namespace first, policies last)."""
    return [
        namespace(values),
        *state_claim(values),
        *service_accounts(values),
        *rbac(values),
        *gateway(values, gateway_config),
        *triton(values, gateway_config.served_models),
        *network_policies(values),
    ]


def create_once_objects(values: DeployValues, gateway_config: GatewayConfig) -> list[dict[str, Any]]:
    """Objects to `kubectl create` once and never re-apply: the HTTPRoute, whose rules the rollout owns."""
    if values.routing.mode != "httproute":
        return []
    from mlrelease.deploy.httproute import initial_route

    return [initial_route(values, gateway_config)]


def render_file(values_path: str | Path) -> tuple[DeployValues, list[dict[str, Any]]]:
    """Load and validate a values file and its gateway config, and render the manifests."""
    path = Path(values_path)
    values = load_values(path)
    config = cluster_gateway_config(values, path.resolve().parent)
    return values, render_objects(values, config)


def render_monitoring(values_path: str | Path) -> list[dict[str, Any]]:
    """The Prometheus Operator objects of a values file (deploy/monitoring.py)."""
    from mlrelease.deploy.monitoring import monitoring_objects

    return monitoring_objects(load_values(Path(values_path)))


def render_create_once(values_path: str | Path) -> list[dict[str, Any]]:
    """The create-once objects of a values file (empty unless routing.mode is httproute)."""
    path = Path(values_path)
    values = load_values(path)
    return create_once_objects(values, cluster_gateway_config(values, path.resolve().parent))


def object_name(obj: dict[str, Any]) -> str:
    """`Kind/namespace/name` of a manifest."""
    meta = obj.get("metadata", {})
    return "/".join(p for p in (obj.get("kind", "?"), meta.get("namespace"), meta.get("name", "?")) if p)


def validation_problems(objects: list[dict[str, Any]], kubernetes_version: str = KUBERNETES_VERSION) -> list[str]:
    """Strict schema violations (unknown fields are errors) of each object, named by object and field path."""
    import kubernetes_validate

    problems = []
    for obj in objects:
        try:
            strict_validate(obj, kubernetes_version)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{object_name(obj)}: {'.'.join(str(p) for p in exc.path)}: {exc.message}")
    duplicates = [name for name, count in Counter(map(object_name, objects)).items() if count > 1]
    problems += [f"{name}: rendered twice" for name in duplicates]
    return problems


def check_objects(objects: list[dict[str, Any]], kubernetes_version: str = KUBERNETES_VERSION) -> None:
    """StepError listing every invalid manifest."""
    problems = validation_problems(objects, kubernetes_version)
    if problems:
        raise StepError("rendered manifests are invalid: " + "; ".join(problems))


def yaml_stream(objects: list[dict[str, Any]]) -> str:
    """All manifests as one multi-document YAML stream."""
    return yaml.safe_dump_all(objects, sort_keys=False)


def file_name(index: int, obj: dict[str, Any]) -> str:
    """`NN-kind-name.yaml`: apply order in the file name, so `kubectl apply -f DIR` keeps it."""
    slug = re.sub(r"[^a-z0-9-]+", "-", f"{obj['kind']}-{obj['metadata']['name']}".lower())
    return f"{index:02d}-{slug}.yaml"


def write_objects(objects: list[dict[str, Any]], out_dir: str | Path) -> list[Path]:
    """One file per manifest in a new or empty `out_dir` (stale manifests there would be applied too)."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise StepError(f"--out {out} must be a new or empty directory: old manifests in it would be applied too")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for index, obj in enumerate(objects):
        path = out / file_name(index, obj)
        path.write_text(yaml.safe_dump(obj, sort_keys=False), encoding="utf-8")
        written.append(path)
    return written


def summary(values: DeployValues, objects: list[dict[str, Any]], kubernetes_version: str) -> dict[str, Any]:
    """What was rendered: counts by kind, the object names, and the settings that decide the shape."""
    return {
        "kubernetes_version": kubernetes_version,
        "namespace": values.namespace,
        "routing_mode": values.routing.mode,
        "kinds": dict(Counter(obj["kind"] for obj in objects)),
        "objects": [object_name(obj) for obj in objects],
    }
