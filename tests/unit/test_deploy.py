"""deploy/: manifests rendered from validated values — schema-valid, least privilege, exact network flows."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib.resources
import json
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import referencing
import yaml

from mlrelease.cli import run
from mlrelease.deploy.cli import register
from mlrelease.deploy.gateway_config import cluster_gateway_config, triton_url
from mlrelease.deploy.kube_schema import strict_validate
from mlrelease.deploy.meta import STATE_MOUNT
from mlrelease.deploy.meta import selector as pod_selector
from mlrelease.deploy.monitoring import monitoring_objects, source_selector
from mlrelease.deploy.network import network_policies, peer_selectors
from mlrelease.deploy.quantity import parse_quantity
from mlrelease.deploy.render import render_file, render_objects
from mlrelease.deploy.values import DeployValues, load_values
from mlrelease.errors import StepError
from mlrelease.gateway.config import GatewayConfig
from mlrelease.release_spec import process_spec
from mlrelease.settings import Settings
from mlrelease.yamlconfig import safe_load

REPO = Path(__file__).resolve().parents[2]
VALUES = REPO / "deploy" / "values.yaml"
AIRFLOW_VALUES = REPO / "deploy" / "airflow" / "values.yaml"
CHART_SCHEMA = REPO / "tests" / "fixtures" / "schemas" / "airflow-chart-values.schema.json"
K8S_VERSION = "1.37.0"
API_CIDR = "10.96.0.1/32"
PLANE_NS = "envoy-gateway-system"
PLANE_LABELS = {"app.kubernetes.io/component": "proxy"}


def raw_values() -> dict[str, Any]:
    """deploy/values.yaml as a plain mapping, its gateway config path made absolute (for copies in tmp dirs)."""
    raw = safe_load(VALUES.read_text(encoding="utf-8"))
    raw["gateway"]["configFile"] = str((VALUES.parent / raw["gateway"]["configFile"]).resolve())
    return raw


def httproute_raw() -> dict[str, Any]:
    """The shipped values switched to httproute routing, with the API server and data plane named."""
    raw = raw_values()
    raw["routing"]["mode"] = "httproute"
    raw["network"]["kubernetesApi"] = {"cidrs": [API_CIDR], "ports": [443, 6443]}
    raw["network"]["routeDataPlane"] = {"namespace": PLANE_NS, "podLabels": PLANE_LABELS}
    return raw


def render(raw: dict[str, Any]) -> tuple[DeployValues, list[dict[str, Any]]]:
    """Validate a values mapping and render it."""
    values = DeployValues.model_validate(raw)
    return values, render_objects(values, cluster_gateway_config(values, VALUES.parent))


@pytest.fixture(scope="module")
def shipped() -> tuple[DeployValues, list[dict[str, Any]]]:
    return render_file(VALUES)


@pytest.fixture(scope="module")
def routed() -> tuple[DeployValues, list[dict[str, Any]]]:
    return render(httproute_raw())


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def pod_spec(objects: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    return named(objects, "Deployment", deployment)["spec"]["template"]["spec"]


# --- every object is a valid Kubernetes 1.37 object ---------------------------------------------------------


@pytest.mark.parametrize("mode", ["gateway", "httproute"])
def test_every_rendered_object_passes_strict_kubernetes_validation(
    mode: str, shipped: tuple[DeployValues, list[dict[str, Any]]], routed: tuple[DeployValues, list[dict[str, Any]]]
) -> None:
    _, objects = shipped if mode == "gateway" else routed
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service"} <= kinds
    assert {"PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy", "PersistentVolumeClaim"} <= kinds
    for obj in objects:
        strict_validate(obj, K8S_VERSION)


def test_strict_validation_would_catch_a_broken_object(shipped: tuple[DeployValues, list[dict[str, Any]]]) -> None:
    broken = copy.deepcopy(named(shipped[1], "Deployment", "triton"))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["httpGet"]["paht"] = "/x"
    with pytest.raises(kubernetes_validate.ValidationError):
        strict_validate(broken, K8S_VERSION)


# --- least privilege --------------------------------------------------------------------------------------


def rules_bound_to(objects: list[dict[str, Any]], account: str, namespace: str) -> list[dict[str, Any]]:
    """Every rule of every Role bound to the service account (namespace/name)."""
    rules = []
    for binding in of_kind(objects, "RoleBinding"):
        subjects = binding["subjects"]
        if {"kind": "ServiceAccount", "name": account, "namespace": namespace} in subjects:
            role = named(objects, "Role", binding["roleRef"]["name"])
            assert role["metadata"]["namespace"] == binding["metadata"]["namespace"]
            rules += [dict(rule, namespace=role["metadata"]["namespace"]) for rule in role["rules"]]
    return rules


def test_step_service_account_has_no_api_access_in_gateway_mode(
    shipped: tuple[DeployValues, list[dict[str, Any]]],
) -> None:
    values, objects = shipped
    assert values.routing.mode == "gateway"
    assert rules_bound_to(objects, values.steps.serviceAccount, values.namespace) == []
    account = named(objects, "ServiceAccount", values.steps.serviceAccount)
    assert account["automountServiceAccountToken"] is False


def test_step_service_account_may_only_get_and_patch_its_own_route_in_httproute_mode(
    routed: tuple[DeployValues, list[dict[str, Any]]],
) -> None:
    values, objects = routed
    assert rules_bound_to(objects, values.steps.serviceAccount, values.namespace) == [
        {
            "apiGroups": ["gateway.networking.k8s.io"],
            "resources": ["httproutes"],
            "resourceNames": [values.routing.httpRoute.name],
            "verbs": ["get", "patch"],
            "namespace": values.route_namespace,
        }
    ]


@pytest.mark.parametrize("mode", ["gateway", "httproute"])
def test_no_wildcards_and_no_cluster_wide_rbac(
    mode: str, shipped: tuple[DeployValues, list[dict[str, Any]]], routed: tuple[DeployValues, list[dict[str, Any]]]
) -> None:
    _, objects = shipped if mode == "gateway" else routed
    assert not of_kind(objects, "ClusterRole") and not of_kind(objects, "ClusterRoleBinding")
    for role in of_kind(objects, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), f"{role['metadata']['name']}: {field} has '*'"


def test_airflow_workers_may_only_run_pods_in_the_step_namespace(
    shipped: tuple[DeployValues, list[dict[str, Any]]],
) -> None:
    values, objects = shipped
    for account in values.airflow.serviceAccounts:
        rules = rules_bound_to(objects, account, values.airflow.namespace)
        assert rules, f"{account} is bound to nothing"
        assert {r["namespace"] for r in rules} == {values.namespace}
        assert {g for r in rules for g in r["apiGroups"]} == {""}
        resources = {res for r in rules for res in r["resources"]}
        # pods/exec: the operator reads the XCom sidecar's file through exec.
        assert resources <= {"pods", "pods/log", "pods/exec", "events"}, resources
        by_resource = {res: set(r["verbs"]) for r in rules for res in r["resources"]}
        assert by_resource["pods/log"] == {"get"} and by_resource["events"] <= {"list", "watch", "get"}
        assert "create" in by_resource["pods"] and "delete" in by_resource["pods"]


def test_gateway_and_triton_have_no_api_access(shipped: tuple[DeployValues, list[dict[str, Any]]]) -> None:
    values, objects = shipped
    for account, deployment in (
        (values.gateway.serviceAccount, values.gateway.name),
        (values.triton.serviceAccount, values.triton.name),
    ):
        assert rules_bound_to(objects, account, values.namespace) == []
        spec = pod_spec(objects, deployment)
        assert spec["serviceAccountName"] == account and spec["automountServiceAccountToken"] is False


@pytest.mark.parametrize("deployment", ["mlrelease-gateway", "triton"])
def test_workloads_run_under_the_restricted_profile(
    deployment: str, shipped: tuple[DeployValues, list[dict[str, Any]]]
) -> None:
    spec = pod_spec(shipped[1], deployment)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in spec["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert "memory" in container["resources"]["limits"]
    namespace = named(shipped[1], "Namespace", shipped[0].namespace)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


# --- probes, PDB, HPA -------------------------------------------------------------------------------------


def container(objects: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    (only,) = pod_spec(objects, deployment)["containers"]
    return only


def startup_window(probe: dict[str, Any]) -> int:
    return int(probe["failureThreshold"]) * int(probe["periodSeconds"])


def test_triton_startup_probe_covers_the_model_load_budget(shipped: tuple[DeployValues, list[dict[str, Any]]]) -> None:
    values, objects = shipped
    server = container(objects, values.triton.name)
    assert startup_window(server["startupProbe"]) >= values.triton.modelLoadBudgetSeconds
    assert server["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert server["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    args = server["args"]
    assert "--model-control-mode=explicit" in args and "--exit-on-error=false" in args
    assert server["resources"]["limits"]["nvidia.com/gpu"] == str(values.triton.gpus)
    spec = pod_spec(objects, values.triton.name)
    assert spec["nodeSelector"] == values.gpu.nodeSelector
    assert {"key": values.gpu.tolerationKey, "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_a_restarted_triton_pod_loads_the_declared_versions(
    shipped: tuple[DeployValues, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restarted (crash, liveness, node loss), the pod loads by itself what the repository's policy declares: from
    the repository the steps write that policy into, with the gateway's model named on --load-model."""
    import dataclasses

    from mlrelease.registry import MODEL_NAME
    from mlrelease.serving.triton_repo import model_repository
    from mlrelease.settings import Settings

    values, objects = shipped
    spec = pod_spec(objects, values.triton.name)
    assert spec["restartPolicy"] == "Always"
    server = container(objects, values.triton.name)
    args = server["args"]
    assert f"--load-model={MODEL_NAME}" in args and "--model-control-mode=explicit" in args
    assert "--exit-on-error=false" in args  # one version that fails to load must not keep the others down
    (mount,) = [m for m in server["volumeMounts"] if m["name"] == "models"]
    assert f"--model-repository={mount['mountPath']}" in args
    (volume,) = [v for v in spec["volumes"] if v["name"] == "models"]
    assert volume["persistentVolumeClaim"]["claimName"] == values.state.claimName
    # Step pods run with MLRELEASE_HOME on the same claim: their model repository is the sub-path Triton mounts.
    monkeypatch.delenv("MLRELEASE_MODEL_REPOSITORY", raising=False)
    steps = dataclasses.replace(Settings.from_env(), home=Path(STATE_MOUNT))
    assert model_repository(steps) == Path(STATE_MOUNT) / mount["subPath"]
    assert server["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert server["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}


def test_a_triton_that_would_restart_without_the_gateways_model_is_refused() -> None:
    raw = raw_values()
    raw["triton"]["loadModels"] = ["some_other_model"]
    with pytest.raises(StepError, match="does not include \\['parcel_eta'\\].*restarted Triton pod would come back"):
        render(raw)


def test_a_gateway_serving_two_models_needs_both_loaded_and_keeps_each_models_decision_folder(tmp_path) -> None:
    config = safe_load((REPO / "config" / "gateway.yaml").read_text(encoding="utf-8"))
    config["models"] = ["parcel_eta", "late_delivery"]
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    raw = raw_values()
    raw["gateway"]["configFile"] = str(tmp_path / "gateway.yaml")
    raw["triton"]["loadModels"] = ["parcel_eta"]
    with pytest.raises(StepError, match="does not include \\['late_delivery'\\], served by the gateway"):
        render(raw)
    raw["triton"]["loadModels"] = ["late_delivery", "parcel_eta"]
    values = DeployValues.model_validate(raw)
    served = cluster_gateway_config(values, VALUES.parent)
    assert served.served_models == ("parcel_eta", "late_delivery")
    assert served.routing.state_url == values.routing.stateUrl and served.decision_log.directory == ""
    home = dataclasses.replace(Settings.from_env(), home=Path(STATE_MOUNT))
    assert served.decision_dir(home, "late_delivery") == Path(STATE_MOUNT) / "gateway" / "late_delivery" / "decisions"
    render(raw)


def test_losing_one_gateway_pod_leaves_others_serving(shipped: tuple[DeployValues, list[dict[str, Any]]]) -> None:
    values, objects = shipped
    assert values.gateway.fewest_replicas >= 2 and values.gateway.replicas >= 2
    pdb = named(objects, "PodDisruptionBudget", values.gateway.name)
    assert pdb["spec"]["maxUnavailable"] < values.gateway.fewest_replicas


@pytest.mark.parametrize("budget", [45, 600, 1234])
def test_a_longer_load_budget_lengthens_the_startup_probe(budget: int) -> None:
    raw = raw_values()
    raw["triton"]["modelLoadBudgetSeconds"] = budget
    values, objects = render(raw)
    probe = container(objects, values.triton.name)["startupProbe"]
    period = values.triton.probes.startup.periodSeconds
    assert probe["failureThreshold"] == math.ceil(budget / period)
    assert startup_window(probe) >= budget


def test_gateway_probes_use_its_endpoints(shipped: tuple[DeployValues, list[dict[str, Any]]]) -> None:
    values, objects = shipped
    gw = container(objects, values.gateway.name)
    assert gw["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert gw["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert startup_window(gw["startupProbe"]) >= values.gateway.startupBudgetSeconds
    assert {"name": "http", "containerPort": values.gateway.port, "protocol": "TCP"} in gw["ports"]


def test_pdb_and_hpa_agree_with_the_deployment(shipped: tuple[DeployValues, list[dict[str, Any]]]) -> None:
    values, objects = shipped
    name = values.gateway.name
    deployment = named(objects, "Deployment", name)
    hpa = named(objects, "HorizontalPodAutoscaler", name)
    pdb = named(objects, "PodDisruptionBudget", name)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
    assert "replicas" not in deployment["spec"]  # the HPA owns the count
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (deployment["spec"]["selector"], pdb["spec"]["selector"]):
        assert selector["matchLabels"].items() <= pod_labels.items()


def test_without_autoscaling_the_deployment_holds_the_replica_count() -> None:
    raw = raw_values()
    raw["gateway"]["autoscaling"]["enabled"] = False
    raw["gateway"]["replicas"] = 4
    values, objects = render(raw)
    assert named(objects, "Deployment", values.gateway.name)["spec"]["replicas"] == 4
    assert of_kind(objects, "HorizontalPodAutoscaler") == []


# --- network policies -------------------------------------------------------------------------------------


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items() and not selector.get("matchExpressions")


def peer_matches(peer: dict[str, Any], policy_ns: str, other: tuple[str, dict[str, str]] | str) -> bool:
    """Whether a NetworkPolicyPeer admits `other`: (namespace, pod labels) or an IP address."""
    if isinstance(other, str):
        import ipaddress

        block = peer.get("ipBlock")
        return block is not None and ipaddress.ip_address(other) in ipaddress.ip_network(block["cidr"])
    namespace, labels = other
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        ns_ok = selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": namespace})
    else:
        ns_ok = namespace == policy_ns
    return ns_ok and selects(peer.get("podSelector", {}), labels)


def allowed(
    policies: list[dict[str, Any]],
    direction: str,
    pod: dict[str, str],
    other: tuple[str, dict[str, str]] | str,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """Whether the policies let `pod` (in the release namespace) talk to/from `other` on port/protocol."""
    field, peers_key = ("ingress", "from") if direction == "Ingress" else ("egress", "to")
    for policy in policies:
        spec, ns = policy["spec"], policy["metadata"]["namespace"]
        if direction not in spec["policyTypes"] or not selects(spec["podSelector"], pod):
            continue
        for rule in spec.get(field, []):
            port_ok = any(p["port"] == port and p.get("protocol", "TCP") == protocol for p in rule["ports"])
            if port_ok and any(peer_matches(peer, ns, other) for peer in rule[peers_key]):
                return True
    return False


@pytest.fixture(scope="module")
def step_pod() -> dict[str, Any]:
    """A step pod exactly as the DAG's KubernetesPodOperator builds it (defaults: no MLRELEASE_K8S_* set)."""
    from mlrelease_airflow.render_pods import render_manifest

    return render_manifest("benchmark")


def labels_of(objects: list[dict[str, Any]], deployment: str) -> dict[str, str]:
    return dict(named(objects, "Deployment", deployment)["spec"]["template"]["metadata"]["labels"])


def test_default_deny_covers_every_pod_in_both_directions(shipped: tuple[DeployValues, list[dict[str, Any]]]) -> None:
    deny = named(shipped[1], "NetworkPolicy", "default-deny-all")
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


def test_network_policies_allow_exactly_the_release_flows(
    shipped: tuple[DeployValues, list[dict[str, Any]]], step_pod: dict[str, Any]
) -> None:
    values, objects = shipped
    policies, net = of_kind(objects, "NetworkPolicy"), values.network
    gw, triton = labels_of(objects, values.gateway.name), labels_of(objects, values.triton.name)
    steps = step_pod["metadata"]["labels"]
    ns, tp = values.namespace, values.triton.ports
    prometheus = ("monitoring", {"app.kubernetes.io/name": "prometheus"})
    ingress_nginx = ("ingress-nginx", {"app.kubernetes.io/name": "ingress-nginx"})
    redis = (ns, dict(net.redis.podLabels))
    mlflow = ("mlflow", {"app.kubernetes.io/name": "mlflow"})
    dns = ("kube-system", {"k8s-app": "kube-dns"})
    feast_registry = ("postgres", {"app.kubernetes.io/name": "postgresql"})  # Feast's SQL registry

    # gateway
    assert allowed(policies, "Ingress", gw, ingress_nginx, values.gateway.port)
    assert allowed(policies, "Ingress", gw, prometheus, values.gateway.port)
    assert allowed(policies, "Egress", gw, (ns, triton), tp.http)
    assert allowed(policies, "Egress", gw, redis, 6379)
    assert allowed(policies, "Egress", gw, feast_registry, 5432)
    assert allowed(policies, "Egress", gw, dns, 53, "UDP") and allowed(policies, "Egress", gw, dns, 53, "TCP")
    # Triton
    assert allowed(policies, "Ingress", triton, (ns, gw), tp.http)
    assert allowed(policies, "Ingress", triton, (ns, steps), tp.http)
    assert allowed(policies, "Ingress", triton, prometheus, tp.metrics)
    # step pods
    for target, port in (((ns, triton), tp.http), (redis, 6379), (mlflow, 5000), (feast_registry, 5432), (dns, 53)):
        assert allowed(policies, "Egress", steps, target, port), (target, port)

    # …and nothing else
    assert not allowed(policies, "Ingress", gw, ("default", {"app": "anything"}), values.gateway.port)
    assert not allowed(policies, "Ingress", gw, ingress_nginx, 9999)
    assert not allowed(policies, "Egress", gw, mlflow, 5000)
    assert not allowed(policies, "Ingress", triton, ingress_nginx, tp.http)
    assert not allowed(policies, "Ingress", triton, prometheus, tp.http)
    assert not allowed(policies, "Egress", triton, redis, 6379)
    assert not allowed(policies, "Egress", triton, feast_registry, 5432)
    assert not allowed(policies, "Egress", steps, feast_registry, 5433)
    assert not allowed(policies, "Ingress", steps, (ns, gw), 8080)
    assert not allowed(policies, "Egress", steps, "10.96.0.1", 443)  # no Kubernetes API in gateway mode
    assert not allowed(policies, "Egress", steps, ("default", {"app": "anything"}), 443)


def test_httproute_mode_opens_the_api_server_and_the_data_plane_only(
    routed: tuple[DeployValues, list[dict[str, Any]]], step_pod: dict[str, Any]
) -> None:
    values, objects = routed
    policies = of_kind(objects, "NetworkPolicy")
    steps, triton = step_pod["metadata"]["labels"], labels_of(objects, values.triton.name)
    gw = labels_of(objects, values.gateway.name)
    assert allowed(policies, "Egress", steps, API_CIDR.split("/")[0], 443)
    assert not allowed(policies, "Egress", gw, API_CIDR.split("/")[0], 443)
    assert allowed(policies, "Ingress", triton, (PLANE_NS, PLANE_LABELS), values.triton.ports.http)
    assert not allowed(policies, "Ingress", triton, (PLANE_NS, PLANE_LABELS), values.triton.ports.grpc)


# --- bad values: a clear error naming the field, and nothing written ---------------------------------------


def _set(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = raw
    for key in parents:
        node = node[key]
    node[last] = value


BAD_VALUES = [
    ({"gateway.autoscaling.enabled": False, "gateway.replicas": -2}, ["gateway.replicas", "greater than or equal"]),
    ({"gateway.image.tag": "latest"}, ["gateway.image.tag", "latest"]),
    ({"triton.resources.limits.memory": "2Gi x"}, ["triton.resources.limits.memory", "'2Gi x'"]),
    ({"gateway.replica": 3}, ["gateway.replica", "Extra inputs are not permitted"]),
    (
        {"gateway.autoscaling.minReplicas": 5, "gateway.autoscaling.maxReplicas": 3},
        ["gateway.autoscaling", "minReplicas (5)"],
    ),
    ({"gateway.autoscaling.minReplicas": 1}, ["gateway", "podDisruptionBudget needs at least 2 replicas"]),
    ({"gateway.workers": 2}, ["gateway", "workers must be 1 (got 2)", "scale with replicas"]),
    ({"triton.probes.startup.failureThreshold": 10}, ["triton", "modelLoadBudgetSeconds is 600s"]),
    ({"gateway.resources.requests.memory": "4Gi"}, ["gateway.resources", "requests.memory (4Gi) is above"]),
    ({"namespace": "ML_Release"}, ["namespace", "pattern"]),
    ({"triton.ports.http": 70000}, ["triton.ports.http", "less than or equal to 65535"]),
    ({"routing.mode": "httproute"}, ["network.kubernetesApi"]),
    ({"routing.stateUrl": "redis://:secret@redis:6379/0"}, ["routing.stateUrl", "password"]),
    ({"routing.httpRoute.namespace": "gateways"}, ["routing.httpRoute.namespace 'gateways' must be the release"]),
    ({"monitoring.prometheusUrl": "prometheus:9090"}, ["monitoring.prometheusUrl", "not an http:// or https://"]),
    ({"monitoring.scrapeInterval": "15 s"}, ["monitoring.scrapeInterval", "pattern"]),
]


@pytest.mark.parametrize(("changes", "expected"), BAD_VALUES, ids=[next(iter(c)) for c, _ in BAD_VALUES])
def test_bad_values_fail_naming_the_field_and_write_nothing(
    changes: dict[str, Any], expected: list[str], tmp_path: Path
) -> None:
    raw = raw_values()
    for dotted, value in changes.items():
        _set(raw, dotted, value)
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(raw), encoding="utf-8")
    out = tmp_path / "out"
    args = parse(["deploy", "render", "--values", str(values_file), "--out", str(out)])
    with pytest.raises(StepError) as caught:
        args.handler(args, None)
    message = str(caught.value)
    assert str(values_file) in message
    for part in expected:
        assert part in message, message
    assert not out.exists()


def test_a_gateway_config_that_sets_a_cluster_field_is_refused(tmp_path: Path) -> None:
    config = safe_load((REPO / "config" / "gateway.yaml").read_text(encoding="utf-8"))
    config["routing"]["state_url"] = "redis://elsewhere:6379/0"
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    raw = raw_values()
    raw["gateway"]["configFile"] = str(tmp_path / "gateway.yaml")
    with pytest.raises(StepError, match=r"routing\.state_url is 'redis://elsewhere:6379/0'"):
        render(raw)


@pytest.mark.parametrize(
    ("text", "value"), [("500m", "0.5"), ("2Gi", str(2 * 1024**3)), ("1.5k", "1500"), ("1e3", "1000")]
)
def test_quantities_parse_exactly(text: str, value: str) -> None:
    assert parse_quantity(text) == parse_quantity(value)


@pytest.mark.parametrize("text", ["2Gi x", "2 Gi", "NaN", "Infinity", "2gi", "", "1..5"])
def test_non_quantities_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        parse_quantity(text)


# --- the DAG and the manifests agree ----------------------------------------------------------------------


def test_dag_pod_builder_defaults_name_the_rendered_objects(
    shipped: tuple[DeployValues, list[dict[str, Any]]], step_pod: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlrelease_airflow.pod_spec import STATE_MOUNT as POD_STATE_MOUNT
    from mlrelease_airflow.pod_spec import ClusterSettings

    for name in ("NAMESPACE", "SERVICE_ACCOUNT", "ENV_SECRET", "STATE_CLAIM", "GPU_NODE_SELECTOR", "GPU_TOLERATION"):
        monkeypatch.delenv(f"MLRELEASE_K8S_{name}", raising=False)
    cluster = ClusterSettings.from_env()
    values, objects = shipped
    assert cluster.namespace == values.namespace == named(objects, "Namespace", values.namespace)["metadata"]["name"]
    assert named(objects, "ServiceAccount", cluster.service_account)["metadata"]["namespace"] == cluster.namespace
    assert named(objects, "PersistentVolumeClaim", cluster.state_claim)["metadata"]["namespace"] == cluster.namespace
    assert cluster.env_secret == values.steps.envSecret
    assert dict(cluster.gpu_node_selector) == values.gpu.nodeSelector
    assert cluster.gpu_toleration_key == values.gpu.tolerationKey
    assert cluster.run_as_user == values.runAsUser and POD_STATE_MOUNT == STATE_MOUNT

    # The pod the operator really builds (benchmark: a GPU step) lands in the rendered namespace and objects.
    spec = step_pod["spec"]
    assert step_pod["metadata"]["namespace"] == values.namespace
    assert spec["serviceAccountName"] == values.steps.serviceAccount
    claims = {v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {values.state.claimName}
    env_from = [e["secretRef"]["name"] for c in spec["containers"] for e in c.get("envFrom", [])]
    assert values.steps.envSecret in env_from
    assert spec["nodeSelector"] == pod_spec(objects, values.triton.name)["nodeSelector"]
    # It mounts the gateway ConfigMap, so steps and gateway replicas share one routing store and cohorts.
    maps = {v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v}
    assert maps == {values.gateway.configMap}
    main = next(c for c in spec["containers"] if c["name"] == "base")
    assert {"name": "MLRELEASE_GATEWAY_CONFIG", "value": "/etc/mlrelease/gateway/gateway.yaml"} in main["env"]
    # Its labels are what the step NetworkPolicy selects.
    policy = named(objects, "NetworkPolicy", "mlrelease-steps-egress")
    assert selects(policy["spec"]["podSelector"], step_pod["metadata"]["labels"])


def test_gateway_config_map_is_a_valid_gateway_config_pointing_at_the_cluster(
    shipped: tuple[DeployValues, list[dict[str, Any]]],
) -> None:
    values, objects = shipped
    data = named(objects, "ConfigMap", values.gateway.configMap)["data"]["gateway.yaml"]
    config = GatewayConfig.model_validate(safe_load(data))
    assert config.routing.state_url == values.routing.stateUrl
    assert config.triton_url == triton_url(values) == f"http://triton.{values.namespace}.svc:8000"
    assert config.decision_log.directory == f"{STATE_MOUNT}/gateway/{config.model}/decisions"
    assert "cohorts" not in safe_load(data)  # the model's, from the release spec the image ships
    assert config.cohorts == process_spec().cohorts
    gw = container(objects, values.gateway.name)
    assert gw["command"][:4] == ["mlrelease", "gateway", "--config", "/etc/mlrelease/gateway/gateway.yaml"]


def test_route_settings_agree_with_the_httproute_router_config() -> None:
    values = load_values(VALUES)
    router = safe_load((REPO / "config" / "httproute.yaml").read_text(encoding="utf-8"))
    route = values.routing.httpRoute
    assert route.name == router["name"]
    assert values.route_namespace == router["namespace"]
    assert route.parentGateway.name == router["parent_gateway"]
    assert route.cohortHeader.lower() == router["cohort_header"].lower()
    assert router["backend_service"] == values.triton.name and router["backend_port"] == values.triton.ports.http


# --- the Airflow chart values -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chart_validator() -> jsonschema.protocols.Validator:
    """The chart's schema, its io.k8s.* definitions resolved to kubernetes-validate's strict 1.37 definitions."""
    k8s_file = importlib.resources.files("kubernetes_validate").joinpath(
        "kubernetes-json-schema/v1.37.0-local-strict/_definitions.json"
    )
    k8s = json.loads(k8s_file.read_text(encoding="utf-8"))
    schema = json.loads(CHART_SCHEMA.read_text(encoding="utf-8"))
    names = set(re.findall(r"#/definitions/(io\.k8s\.[A-Za-z0-9.]+)", json.dumps(schema)))
    assert names and names <= set(k8s["$defs"]), names - set(k8s["$defs"])
    schema["definitions"].update({name: {"$ref": f"{k8s['$id']}#/$defs/{name}"} for name in names})
    registry = referencing.Resource.from_contents(k8s) @ referencing.Registry()
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema, registry=registry)


def airflow_values() -> dict[str, Any]:
    return safe_load(AIRFLOW_VALUES.read_text(encoding="utf-8"))


def test_airflow_chart_values_validate_against_the_chart_schema(chart_validator: Any) -> None:
    errors = [f"{list(e.path)}: {e.message}" for e in chart_validator.iter_errors(airflow_values())]
    assert errors == []


@pytest.mark.parametrize(
    ("dotted", "value"),
    [
        ("executor", "Nope"),
        ("workers.replicass", 1),
        ("dags.gitSync.depth", "one"),
        ("workers.tolerations", [{"key": "nvidia.com/gpu", "bogus": True}]),  # a Kubernetes definition, resolved
        ("images.airflow.pullPolicy", "Sometimes"),
    ],
)
def test_broken_airflow_values_fail_the_chart_schema(chart_validator: Any, dotted: str, value: Any) -> None:
    broken = airflow_values()
    *parents, last = dotted.split(".")
    node = broken
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    assert not chart_validator.is_valid(broken)


def test_airflow_values_point_the_dag_at_the_rendered_cluster() -> None:
    values, chart = load_values(VALUES), airflow_values()
    env = {item["name"]: item["value"] for item in chart["env"]}
    assert chart["executor"] == "KubernetesExecutor" and env["MLRELEASE_RUNNER"] == "kubernetes"
    assert env["MLRELEASE_K8S_NAMESPACE"] == values.namespace
    assert env["MLRELEASE_K8S_SERVICE_ACCOUNT"] == values.steps.serviceAccount
    assert env["MLRELEASE_K8S_ENV_SECRET"] == values.steps.envSecret
    assert env["MLRELEASE_K8S_STATE_CLAIM"] == values.state.claimName
    assert env["MLRELEASE_K8S_GPU_TOLERATION"] == values.gpu.tolerationKey
    selector = dict(pair.split("=", 1) for pair in env["MLRELEASE_K8S_GPU_NODE_SELECTOR"].split(","))
    assert selector == values.gpu.nodeSelector
    assert env["MLRELEASE_K8S_GATEWAY_CONFIGMAP"] == values.gateway.configMap
    assert env["MLRELEASE_TRAFFIC_ROUTER"] == values.routing.mode
    assert env["MLRELEASE_METRICS_SOURCE"] == values.monitoring.metricsSource
    assert env["MLRELEASE_PROMETHEUS_URL"] == values.monitoring.prometheusUrl
    assert env["MLRELEASE_PROMETHEUS_SELECTOR"] == source_selector(values)
    assert chart["workers"]["serviceAccount"]["name"] in values.airflow.serviceAccounts
    # Deferrable step pods: the triggerer watches them, so it is bound to the pod-launcher Role too.
    assert env["MLRELEASE_K8S_DEFERRABLE"] == "true" and chart["triggerer"]["enabled"] is True
    assert chart["triggerer"]["serviceAccount"]["name"] in values.airflow.serviceAccounts
    assert chart["postgresql"]["enabled"] is False and chart["data"]["metadataSecretName"]
    assert chart["dags"]["gitSync"]["enabled"] is True and chart["dags"]["gitSync"]["subPath"] == "dags"


def airflow_config_options() -> dict[str, dict[str, Any]]:
    """Airflow's documented options by section: core's config.yml plus the KubernetesExecutor provider's."""
    from airflow.providers.cncf.kubernetes.get_provider_info import get_provider_info

    core = importlib.resources.files("airflow.config_templates").joinpath("config.yml").read_text(encoding="utf-8")
    sections = {**safe_load(core), **get_provider_info()["config"]}
    return {name: section["options"] for name, section in sections.items()}


def repo_airflow_cfg() -> dict[str, list[str]]:
    """The sections and keys of the repository's airflow.cfg (the embedded default)."""
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    parser.read(REPO / "airflow.cfg", encoding="utf-8")
    return {section: list(parser[section]) for section in parser.sections()}


@pytest.mark.parametrize("source", ["deploy/airflow/values.yaml", "airflow.cfg"])
def test_airflow_config_keys_are_current_airflow_3_options(source: str) -> None:
    """Every key of the chart values' `config:` (and of the repo's airflow.cfg) is an option of the installed
    Airflow, under its current name."""
    from airflow.configuration import conf

    options = airflow_config_options()
    renamed = {
        (old_section, old): (new_section, new)
        for (new_section, new), (old_section, old, _) in conf.deprecated_options.items()
    }
    config = airflow_values()["config"] if source.endswith(".yaml") else repo_airflow_cfg()
    problems = []
    for section, keys in config.items():
        for key in keys:
            if (section, key) in renamed:
                problems.append(f"[{section}] {key} is deprecated: use {renamed[(section, key)]}")
            elif key not in options.get(section, {}):
                problems.append(f"[{section}] {key} is not an Airflow option")
            elif options[section][key].get("version_deprecated"):
                problems.append(f"[{section}] {key} is deprecated since {options[section][key]['version_deprecated']}")
    assert problems == []
    # The check itself catches what it is for: the Airflow 2 name of the DAG folder scan interval.
    assert renamed[("scheduler", "dag_dir_list_interval")] == ("dag_processor", "refresh_interval")
    assert "dag_dir_list_interval" not in options["scheduler"]


# --- the CLI, end to end ----------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="mlrelease")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_deploy_render_writes_one_valid_file_per_object(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shipped: tuple[DeployValues, list[dict[str, Any]]]
) -> None:
    out = tmp_path / "manifests"
    args = parse(["deploy", "render", "--values", str(VALUES), "--out", str(out)])
    assert run(args.handler, args) == 0
    result = json.loads(capsys.readouterr().out)
    files = sorted(f for f in out.iterdir() if f.is_file())
    assert [str(f) for f in files] == sorted(result["files"]) and len(files) == len(shipped[1])
    # the Prometheus Operator objects apart (they need its CRDs), one file each
    monitors = sorted((out / "monitoring").iterdir())
    assert [str(f) for f in monitors] == sorted(result["monitoring"])
    assert [safe_load(f.read_text(encoding="utf-8"))["kind"] for f in monitors] == ["PodMonitor"] * 2 + [
        "PrometheusRule"
    ]
    loaded = [safe_load(f.read_text(encoding="utf-8")) for f in files]
    # The objects test_every_rendered_object_passes_strict_kubernetes_validation checks, in apply order.
    assert loaded == shipped[1]
    assert files[0].name.startswith("00-namespace-")

    again = parse(["deploy", "render", "--values", str(VALUES), "--out", str(out)])
    assert run(again.handler, again) == 2  # a non-empty directory is refused: stale files would be applied too
    assert "must be a new or empty directory" in capsys.readouterr().err


def test_deploy_render_streams_yaml_and_check_summarises(
    capsys: pytest.CaptureFixture[str], shipped: tuple[DeployValues, list[dict[str, Any]]]
) -> None:
    args = parse(["deploy", "render", "--values", str(VALUES)])
    assert run(args.handler, args) == 0
    assert list(yaml.safe_load_all(capsys.readouterr().out)) == shipped[1]

    check = parse(["deploy", "check", "--values", str(VALUES)])
    assert run(check.handler, check) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["valid"] is True and summary["kinds"]["NetworkPolicy"] == 5
    assert summary["objects"][0] == f"Namespace/{shipped[0].namespace}"


# --- httproute mode: the route created once, and the router config the steps read --------------------------


def test_httproute_mode_renders_a_valid_route_apart_and_the_router_config_the_steps_mount(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], step_pod: dict[str, Any]
) -> None:
    from mlrelease.rollout.httproute import HTTPRouteConfig, routing_from_route
    from mlrelease.rollout.traffic_router import Routing
    from mlrelease_airflow.pod_spec import ClusterSettings
    from tests.gateway_api_schema import validate_gateway_api

    raw = httproute_raw()
    raw["routing"]["httpRoute"]["initialStableVersion"] = 4
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(raw), encoding="utf-8")
    out = tmp_path / "manifests"
    args = parse(["deploy", "render", "--values", str(values_file), "--out", str(out)])
    assert run(args.handler, args) == 0
    result = json.loads(capsys.readouterr().out)
    # The route is not among the files `kubectl apply -f OUT` re-applies: that would reset a rollout's routing.
    assert not any(safe_load(Path(f).read_text())["kind"] == "HTTPRoute" for f in result["files"])
    [route_file] = result["create_once"]
    route = safe_load(Path(route_file).read_text(encoding="utf-8"))
    assert validate_gateway_api([route]) == [None]
    assert "&id" not in Path(route_file).read_text(encoding="utf-8")  # no YAML anchors in a manifest

    values, objects = render(raw)
    config_map = named(objects, "ConfigMap", values.gateway.configMap)
    config = HTTPRouteConfig.model_validate(safe_load(config_map["data"]["httproute.yaml"]))
    assert routing_from_route(config, route) == Routing(stable_version=4)
    gateway = GatewayConfig.model_validate(safe_load(config_map["data"]["gateway.yaml"]))
    assert config.cohorts == gateway.cohorts.names
    assert (config.name, config.namespace) == (values.routing.httpRoute.name, values.route_namespace)
    # The step pods mount that ConfigMap where the router looks for its config.
    assert ClusterSettings.from_env().gateway_config_map == values.gateway.configMap
    # ...at the path where the router reads its config (the pod the operator really builds).
    main = next(c for c in step_pod["spec"]["containers"] if c["name"] == "base")
    volume = next(
        v["name"] for v in step_pod["spec"]["volumes"] if v.get("configMap", {}).get("name") == values.gateway.configMap
    )
    mount = next(m["mountPath"] for m in main["volumeMounts"] if m["name"] == volume)
    assert {"name": "MLRELEASE_HTTPROUTE_CONFIG", "value": f"{mount}/httproute.yaml"} in main["env"]


def test_a_route_to_arm_gateways_renders_one_gateway_per_arm_and_routes_users_to_them(
    step_pod: dict[str, Any],
) -> None:
    """routing.httpRoute.backends gateways: a stable and a candidate gateway Deployment (each its own arm in its own
    config, selected apart, scraped by the same PodMonitor), the route's backends their Services, and the data plane
    allowed to the gateways' port instead of Triton's."""
    from mlrelease.deploy.httproute import initial_route
    from mlrelease.rollout.httproute import HTTPRouteConfig, routing_from_route
    from mlrelease.rollout.traffic_router import Routing
    from tests.gateway_api_schema import validate_gateway_api

    raw = httproute_raw()
    raw["routing"]["httpRoute"]["backends"] = "gateways"
    values, objects = render(raw)
    for obj in objects:
        strict_validate(obj, K8S_VERSION)
    name = values.gateway.name
    assert not [d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == name]  # no splitting gateway
    for arm in ("stable", "candidate"):
        deployment = named(objects, "Deployment", f"{name}-{arm}")
        select = deployment["spec"]["selector"]["matchLabels"]
        assert select["mlrelease.io/arm"] == arm and selects(
            {"matchLabels": select}, labels_of(objects, f"{name}-{arm}")
        )
        assert named(objects, "Service", f"{name}-{arm}")["spec"]["selector"] == select
        mounted = pod_spec(objects, f"{name}-{arm}")["volumes"][0]["configMap"]["name"]
        config = GatewayConfig.model_validate(safe_load(named(objects, "ConfigMap", mounted)["data"]["gateway.yaml"]))
        assert config.routing.arm == arm
        assert (
            named(objects, "HorizontalPodAutoscaler", f"{name}-{arm}")["spec"]["scaleTargetRef"]["name"]
            == deployment["metadata"]["name"]
        )
    # The steps' config (and the router's) stays in the gateway ConfigMap they mount; the route goes to the arms.
    router = HTTPRouteConfig.model_validate(
        safe_load(named(objects, "ConfigMap", values.gateway.configMap)["data"]["httproute.yaml"])
    )
    assert (router.backends, router.stable_service, router.candidate_service) == (
        "gateways",
        f"{name}-stable",
        f"{name}-candidate",
    )
    route = initial_route(values, cluster_gateway_config(values, VALUES.parent))
    assert validate_gateway_api([route]) == [None] and routing_from_route(router, route) == Routing(stable_version=1)
    assert {r["backendRefs"][0]["name"] for r in route["spec"]["rules"]} == {f"{name}-stable"}
    policies = of_kind(objects, "NetworkPolicy")
    triton = labels_of(objects, values.triton.name)
    for arm in ("stable", "candidate"):
        gw = labels_of(objects, f"{name}-{arm}")
        assert allowed(policies, "Ingress", gw, (PLANE_NS, PLANE_LABELS), values.gateway.port)
    assert not allowed(policies, "Ingress", triton, (PLANE_NS, PLANE_LABELS), values.triton.ports.http)
    from mlrelease.deploy.monitoring import pod_monitor

    monitor = pod_monitor(values, name, "http", "mlrelease-gateway")  # the gateway's, as monitoring renders it
    assert all(
        selects(monitor["spec"]["selector"], labels_of(objects, f"{name}-{arm}")) for arm in ("stable", "candidate")
    )


def test_gateway_mode_has_no_route_and_no_router_config(shipped: tuple[DeployValues, list[dict[str, Any]]]) -> None:
    values, objects = shipped
    assert not of_kind(objects, "HTTPRoute")
    assert "httproute.yaml" not in named(objects, "ConfigMap", values.gateway.configMap)["data"]


# --- Prometheus Operator objects ------------------------------------------------------------------------------


def test_monitoring_objects_are_valid_prometheus_operator_objects_and_the_rules_pass_promtool(tmp_path: Path) -> None:
    """A PodMonitor per workload (every pod scraped on its own, under the job names the alerts use) and the alert
    rules as a PrometheusRule: valid against the operator's CRD schemas, the rules' groups checked by promtool."""
    from tests.prometheus_operator_schema import validate_prometheus_operator

    values = load_values(VALUES)
    objects = monitoring_objects(values)
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("PodMonitor", values.gateway.name),
        ("PodMonitor", values.triton.name),
        ("PrometheusRule", "mlrelease"),
    ]
    assert validate_prometheus_operator(objects) == [None, None, None]
    gateway_monitor = objects[0]
    assert gateway_monitor["spec"]["selector"]["matchLabels"] == pod_selector(values.gateway.name)
    endpoint = gateway_monitor["spec"]["podMetricsEndpoints"][0]
    assert endpoint["port"] == "http" and endpoint["relabelings"][0]["replacement"] == "mlrelease-gateway"
    assert gateway_monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": objects[2]["spec"]["groups"]}))
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    checked = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    broken = {**objects[0], "spec": {**objects[0]["spec"], "podMetricsEndpoints": [{**endpoint, "interval": "15 s"}]}}
    assert "interval" in (validate_prometheus_operator([broken])[0] or "")
    quiet = _values_with({"monitoring.podMonitors": False, "monitoring.prometheusRule": False})
    assert monitoring_objects(quiet) == []


def test_the_prometheus_metrics_source_lets_the_steps_reach_prometheus_and_nothing_else_does() -> None:
    values = load_values(VALUES)
    assert values.monitoring.metricsSource == "decision_log"

    def step_egress(v: DeployValues) -> list[dict]:
        (policy,) = [p for p in network_policies(v) if p["metadata"]["name"] == "mlrelease-steps-egress"]
        return policy["spec"]["egress"]

    prometheus = _values_with({"monitoring.metricsSource": "prometheus"})
    added = [rule for rule in step_egress(prometheus) if rule not in step_egress(values)]
    assert added == [{"to": peer_selectors(values.network.prometheus), "ports": [{"protocol": "TCP", "port": 9090}]}]
    assert source_selector(values) == 'job="mlrelease-gateway", namespace="mlrelease"'


def _values_with(changes: dict[str, Any]) -> DeployValues:
    """deploy/values.yaml with `changes` (dotted paths) applied."""
    raw = raw_values()
    for dotted, value in changes.items():
        _set(raw, dotted, value)
    return DeployValues.model_validate(raw)
