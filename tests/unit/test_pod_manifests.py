"""Every step's pod manifest is what we mean to send, and validates strictly against the Kubernetes schema."""

from __future__ import annotations

import json

import pytest

from mlrelease.yamlconfig import safe_load
from mlrelease_airflow.catalog import STEPS
from mlrelease_airflow.pod_spec import STATE_MOUNT
from mlrelease_airflow.render_pods import render_manifest, render_pods, validation_errors
from tests.conftest import REPO

K8S_VERSION = "1.37.0"


@pytest.mark.parametrize("step", sorted(STEPS))
def test_manifest_validates_and_is_restricted(step):
    manifest = render_manifest(step)
    assert validation_errors(manifest, K8S_VERSION) == []
    spec = manifest["spec"]
    main = next(c for c in spec["containers"] if c["name"] == "base")
    assert main["command"] == ["mlrelease", "step", step]
    assert all("{{" not in arg for arg in main.get("args", []))
    ctx = main["securityContext"]
    assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"] is True
    assert ctx["runAsNonRoot"] is True and ctx["capabilities"]["drop"] == ["ALL"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["serviceAccountName"] == "mlrelease-step"
    assert any(c["name"] == "airflow-xcom-sidecar" for c in spec["containers"])
    assert main["envFrom"] == [{"secretRef": {"name": "mlrelease-step-env"}}]
    assert {"name": "MLRELEASE_XCOM_PATH", "value": "/airflow/xcom/return.json"} in main["env"]
    # The task's identity, rendered: the step records its own outcome on the state volume (mlrelease.outcome).
    assert all("{{" not in e.get("value", "") for e in main["env"])
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["MLRELEASE_TASK_ID"] == step.replace("-", "_") and env["MLRELEASE_TRY_NUMBER"] == "1"
    assert env["MLRELEASE_DATA_INTERVAL_END"] == "2026-11-29T02:00:00+00:00" and env["MLRELEASE_HOME"] == STATE_MOUNT


def test_only_routing_steps_get_an_api_token_and_only_with_the_httproute_router(monkeypatch):
    routing = {"rollout-stage", "analyze", "answer", "promote", "retire", "rollback", "manual-release"}
    assert all(render_manifest(step)["spec"]["automountServiceAccountToken"] is False for step in STEPS)
    monkeypatch.setenv("MLRELEASE_TRAFFIC_ROUTER", "httproute")
    tokens = {step: render_manifest(step)["spec"]["automountServiceAccountToken"] for step in STEPS}
    assert {step for step, mounted in tokens.items() if mounted} == routing
    env = render_manifest("analyze")["spec"]["containers"][0]["env"]
    assert {"name": "MLRELEASE_TRAFFIC_ROUTER", "value": "httproute"} in env


def test_window_arguments_render_from_the_run(monkeypatch):
    main = render_manifest("materialize")["spec"]["containers"][0]
    assert main["args"] == [
        "--start",
        "2026-11-28T02:00:00+00:00",
        "--end",
        "2026-11-29T02:00:00+00:00",
        "--overlap-hours",
        "2",
    ]


def test_benchmark_pod_asks_for_a_gpu_on_gpu_nodes_with_the_perf_image():
    manifest = render_manifest("benchmark")
    assert validation_errors(manifest, K8S_VERSION) == []
    main = manifest["spec"]["containers"][0]
    assert main["image"] == "ghcr.io/mlrelease/perf:0.1.0"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert main["args"][:2] == ["--model-version", "7"]  # rendered from train's XCom
    assert manifest["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert manifest["spec"]["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]


def test_cpu_steps_stay_off_gpu_nodes():
    for step in ("train", "export", "validate-serving", "materialize"):
        spec = render_manifest(step)["spec"]
        assert "nvidia.com/gpu" not in spec["containers"][0]["resources"]["limits"]
        assert not spec.get("nodeSelector") and not spec.get("tolerations")
        assert spec["containers"][0]["image"] == "ghcr.io/mlrelease/step:0.1.0"


def test_validation_catches_a_broken_manifest():
    manifest = render_manifest("materialize")
    manifest["spec"]["containers"][0]["securityContext"]["runAsNonroot"] = True  # misspelt field
    assert validation_errors(manifest, K8S_VERSION)
    manifest = render_manifest("materialize")
    manifest["spec"]["restartPolicy"] = 3
    assert validation_errors(manifest, K8S_VERSION)


def test_render_pods_writes_one_yaml_per_step(tmp_path):
    result = render_pods(tmp_path, kubernetes_version=K8S_VERSION)
    assert sorted(p.split("/")[-1] for p in result["manifests"]) == sorted(f"{s}.yaml" for s in STEPS)
    loaded = safe_load((tmp_path / "check-freshness.yaml").read_text())
    assert loaded["kind"] == "Pod" and loaded["apiVersion"] == "v1"


def test_the_render_pods_command_prints_its_result(tmp_path, capsys):
    """`python -m mlrelease_airflow.render_pods --out DIR` (what `make render-pods` runs)."""
    from mlrelease_airflow.render_pods import main

    assert main(["--out", str(tmp_path), "--kubernetes-version", K8S_VERSION]) == 0
    out = capsys.readouterr().out  # the operator's "Building pod" log lines come first
    assert len(json.loads(out[out.index("{\n") :])["manifests"]) == len(STEPS) == len(list(tmp_path.glob("*.yaml")))
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    assert main(["--out", str(blocked)]) == 2  # one error line, the CLI's step-error code
    assert capsys.readouterr().err.startswith("render-pods: error: ")


# --- the platform's pod template (MLRELEASE_K8S_POD_TEMPLATE_FILE) ------------------------------------------

POD_TEMPLATE = REPO / "deploy" / "airflow" / "step-pod-template.yaml"


@pytest.mark.parametrize("step", ["materialize", "benchmark"])  # a CPU step and the GPU step
def test_pods_merge_the_shipped_pod_template_and_still_validate(step, monkeypatch):
    monkeypatch.setenv("MLRELEASE_K8S_POD_TEMPLATE_FILE", str(POD_TEMPLATE))
    template = safe_load(POD_TEMPLATE.read_text(encoding="utf-8"))
    manifest = render_manifest(step)
    assert validation_errors(manifest, K8S_VERSION) == []
    meta, spec = manifest["metadata"], manifest["spec"]
    main = next(c for c in spec["containers"] if c["name"] == "base")
    # What the template adds survives: labels and annotations next to ours, fields the step leaves open, its env.
    assert meta["labels"]["example.org/cost-center"] == "ml-platform"
    assert meta["labels"]["app.kubernetes.io/component"] == step
    assert meta["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert spec["priorityClassName"] == "ml-batch"
    assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert {"name": "NO_PROXY", "value": ".svc,.cluster.local"} in main["env"]
    assert {"name": "MLRELEASE_XCOM_PATH", "value": "/airflow/xcom/return.json"} in main["env"]
    # Tolerations are joined: the GPU step keeps the platform's and adds its own.
    platform = template["spec"]["tolerations"]
    if step == "benchmark":
        gpu = {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}
        assert spec["tolerations"] == [*platform, gpu]
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    else:
        assert spec["tolerations"] == platform
    # What the step sets wins: image, command, the restricted security contexts, the XCom sidecar.
    assert main["command"] == ["mlrelease", "step", step]
    assert main["securityContext"]["readOnlyRootFilesystem"] is True and spec["securityContext"]["runAsNonRoot"]
    assert [c["name"] for c in spec["containers"]] == ["base", "airflow-xcom-sidecar"]


def test_a_configured_pod_template_that_does_not_exist_fails_the_task(monkeypatch, tmp_path):
    from airflow.sdk.exceptions import AirflowFailException

    missing = tmp_path / "absent.yaml"
    monkeypatch.setenv("MLRELEASE_K8S_POD_TEMPLATE_FILE", str(missing))
    with pytest.raises(AirflowFailException, match=f"pod template file {missing} .* does not exist"):
        render_manifest("materialize")


def test_without_a_pod_template_the_operator_gets_none(monkeypatch):
    monkeypatch.delenv("MLRELEASE_K8S_POD_TEMPLATE_FILE", raising=False)
    from mlrelease_airflow.factory import step_operator

    assert step_operator("materialize", model="parcel_eta", runner="kubernetes").pod_template_file is None
