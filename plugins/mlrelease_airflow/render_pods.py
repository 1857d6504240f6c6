"""Every step's Kubernetes pod manifest, rendered as the DAG would send it and validated.

It renders through the Airflow operators, so it lives with them rather than in the `mlrelease` package (which
never imports plugins/). Run it with plugins/ on the path, as Airflow puts its plugins folder there:
`make render-pods OUT=DIR`, i.e. `PYTHONPATH=plugins python -m mlrelease_airflow.render_pods --out DIR`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from mlrelease.errors import StepError
from mlrelease.exit_codes import EXIT_OK, EXIT_STEP_ERROR
from mlrelease.stepdefs import NIGHTLY_PARAMS, RELEASE_CONTROL_PARAMS
from mlrelease_airflow.catalog import STEPS
from mlrelease_airflow.kubernetes import kubernetes_step_operator
from mlrelease_airflow.pod_spec import ClusterSettings

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


def render_manifest(step: str, context: dict[str, Any] | None = None) -> dict[str, Any]:
    """The pod manifest (plain dict, API field names) that the KubernetesPodOperator would create for `step`."""
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment
    from kubernetes.client import ApiClient

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

    from mlrelease.deploy.kube_schema import strict_validate

    try:
        strict_validate(manifest, kubernetes_version)
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(str(p) for p in exc.path)}: {exc.message}"]
    return []


def render_pods(out: str | Path, *, kubernetes_version: str) -> dict[str, Any]:
    """Write `<out>/<step>.yaml` for every catalogue step; fail naming any manifest that does not validate."""
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


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m mlrelease_airflow.render_pods --out DIR`: print the JSON result, or one error line and exit 2."""
    parser = argparse.ArgumentParser(
        prog="python -m mlrelease_airflow.render_pods",
        description="write and validate every step's Kubernetes pod manifest",
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--kubernetes-version", default="1.37.0")
    args = parser.parse_args(argv)
    try:
        result = render_pods(args.out, kubernetes_version=args.kubernetes_version)
    except (StepError, ValueError, OSError) as exc:
        print(f"render-pods: error: {exc}", file=sys.stderr)
        return EXIT_STEP_ERROR
    print(json.dumps(result, indent=2, default=str))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
