"""`mlrelease render-pods`: every step's Kubernetes pod manifest, rendered as the DAG would send it and validated."""

from __future__ import annotations

import dataclasses
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from mlrelease.errors import StepError
from mlrelease.settings import REPO_ROOT

# A representative run: the values Airflow substitutes into the step arguments.
SAMPLE_CONTEXT: dict[str, Any] = {
    "data_interval_start": datetime(2026, 11, 28, 2, tzinfo=UTC),
    "data_interval_end": datetime(2026, 11, 29, 2, tzinfo=UTC),
    "params": {
        "materialize_overlap_hours": 2,
        "reference_days": 7,
        "psi_threshold": 0.25,
        "training_days": 7,
        "mae_tolerance": 0.05,
        "max_p99_ratio": 1.1,
        "min_throughput_ratio": 0.9,
        "rollout_profile": "production",
        "rollout_plan": "config/rollout_plan.yaml",
        # rollback_release's form
        "model": "parcel_eta",
        "action": "rollback_to_version",
        "target_version": 6,
        "reason": "manual rollback from the Airflow UI",
    },
    "run_id": "scheduled__2026-11-29T02:00:00+00:00",
    # What `train` pushes to XCom, for the steps that take the model version from it.
    "ti": SimpleNamespace(xcom_pull=lambda task_ids: {"model_version": 7}),
}


def _plugins_on_path() -> None:
    plugins = str(REPO_ROOT / "plugins")
    if plugins not in sys.path:
        sys.path.insert(0, plugins)


def render_manifest(step: str, context: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pod manifest (plain dict, API field names) that the KubernetesPodOperator would create for `step`."""
    _plugins_on_path()
    import jinja2
    from kubernetes.client import ApiClient

    from mlrelease_airflow.catalog import STEPS
    from mlrelease_airflow.kubernetes import kubernetes_step_operator
    from mlrelease_airflow.pod_spec import ClusterSettings

    values = context or SAMPLE_CONTEXT
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    pod = STEPS[step]
    rendered = dataclasses.replace(pod, args=tuple(env.from_string(a).render(**values) for a in pod.args))
    operator = kubernetes_step_operator(step.replace("-", "_"), rendered, ClusterSettings.from_env())
    manifest: dict[str, Any] = ApiClient().sanitize_for_serialization(
        operator.build_pod_request_obj(dry_run=True)
    )  # dry_run: no cluster is contacted
    return manifest


def validation_errors(manifest: dict[str, Any], kubernetes_version: str) -> list[str]:
    """Schema violations of a manifest under strict validation (unknown fields are errors)."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(manifest, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(str(p) for p in exc.path)}: {exc.message}"]
    return []


def render_pods(out: str | Path, *, kubernetes_version: str) -> dict[str, Any]:
    """Write `<out>/<step>.yaml` for every catalogue step; fail naming any manifest that does not validate."""
    _plugins_on_path()
    from mlrelease_airflow.catalog import STEPS

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    written, problems = [], []
    for step in STEPS:
        manifest = render_manifest(step)
        problems += [f"{step}: {e}" for e in validation_errors(manifest, kubernetes_version)]
        path = out_dir / f"{step}.yaml"
        path.write_text(yaml.safe_dump(manifest, sort_keys=False), encoding="utf-8")
        written.append(str(path))
    if problems:
        raise StepError("invalid pod manifests: " + "; ".join(problems))
    return {"kubernetes_version": kubernetes_version, "manifests": written}
