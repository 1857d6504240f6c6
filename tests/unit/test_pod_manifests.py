"""Every step's pod manifest is what we mean to send, and validates strictly against the Kubernetes schema."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from mlrelease.render import render_manifest, render_pods, validation_errors
from mlrelease_airflow.catalog import STEPS

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


def test_gpu_step_requests_a_gpu_on_gpu_nodes(monkeypatch):
    gpu = dataclasses.replace(
        STEPS["validate-data"],
        step="benchmark",
        resources=dataclasses.replace(STEPS["validate-data"].resources, gpus=1),
    )
    monkeypatch.setitem(STEPS, "benchmark", gpu)
    manifest = render_manifest("benchmark")
    assert validation_errors(manifest, K8S_VERSION) == []
    main = manifest["spec"]["containers"][0]
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert manifest["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert manifest["spec"]["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]


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
    loaded = yaml.safe_load((tmp_path / "check-freshness.yaml").read_text())
    assert loaded["kind"] == "Pod" and loaded["apiVersion"] == "v1"
