"""`mlrelease render-pods`: every step's Kubernetes pod manifest, rendered as the DAG would send it and validated."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from mlrelease.errors import StepError
from mlrelease.settings import REPO_ROOT
from mlrelease.stepdefs import NIGHTLY_PARAMS, RELEASE_CONTROL_PARAMS

# A representative run: the values Airflow substitutes into the step arguments and env.
SAMPLE_CONTEXT: dict[str, Any] = {
    "data_interval_start": datetime(2026, 11, 28, 2, tzinfo=UTC),
    "data_interval_end": datetime(2026, 11, 29, 2, tzinfo=UTC),
    # Both forms' defaults (declared with the steps), and a version for rollback_release's optional one.
    "params": {p.name: p.default for p in (*NIGHTLY_PARAMS, *RELEASE_CONTROL_PARAMS)} | {"target_version": 6},
    "run_id": "scheduled__2026-11-29T02:00:00+00:00",
}
SAMPLE_XCOM = {"train": {"model_version": 7}}  # what `train` pushes, for the steps that take the model version


def sample_context(task_id: str, context: dict[str, Any] | None = None) -> dict[str, Any]:
    """The context one task renders with: `context` (default SAMPLE_CONTEXT) plus the task instance `ti`."""
    ti = SimpleNamespace(task_id=task_id, try_number=1, xcom_pull=lambda task_ids: SAMPLE_XCOM[task_ids])
    return {"ti": ti, **(context or SAMPLE_CONTEXT)}


def _plugins_on_path() -> None:
    plugins = str(REPO_ROOT / "plugins")
    if plugins not in sys.path:
        sys.path.insert(0, plugins)


def render_manifest(step: str, context: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pod manifest (plain dict, API field names) that the KubernetesPodOperator would create for `step`."""
    _plugins_on_path()
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment
    from kubernetes.client import ApiClient

    from mlrelease_airflow.catalog import STEPS
    from mlrelease_airflow.kubernetes import kubernetes_step_operator
    from mlrelease_airflow.pod_spec import ClusterSettings

    task_id = step.replace("-", "_")
    operator = kubernetes_step_operator(task_id, STEPS[step], ClusterSettings.from_env())
    # Rendered as Airflow renders a task (arguments, env, every templated field); unknown names are errors.
    operator.render_template_fields(
        sample_context(task_id, context), jinja_env=SandboxedEnvironment(undefined=StrictUndefined)
    )
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
