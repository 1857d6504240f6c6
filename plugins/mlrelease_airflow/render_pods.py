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
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from mlrelease.errors import StepError
from mlrelease.exit_codes import EXIT_OK, EXIT_STEP_ERROR
from mlrelease.release_spec import nightly_dag_id, process_spec, spec_named
from mlrelease.stepdefs import nightly_params, release_control_params
from mlrelease_airflow.catalog import STEPS
from mlrelease_airflow.kubernetes import kubernetes_step_operator
from mlrelease_airflow.pod_spec import ClusterSettings


def sample_run(model: str) -> dict[str, Any]:
    """A representative run of model `model`'s DAGs: the values Airflow substitutes into the step arguments and env.

    Both forms' defaults (declared with the steps, the nightly one from the model's spec), and a version for
    rollback_release's optional one.
    """
    params = (*nightly_params(spec_named(model)), *release_control_params((model,)))
    return {
        "data_interval_start": datetime(2026, 11, 28, 2, tzinfo=UTC),
        "data_interval_end": datetime(2026, 11, 29, 2, tzinfo=UTC),
        "params": {p.name: p.default for p in params} | {"target_version": 6},
        "run_id": "scheduled__2026-11-29T02:00:00+00:00",
        "dag": SimpleNamespace(dag_id=nightly_dag_id(model)),
    }


SAMPLE_XCOM = {"train": {"model_version": 7}}  # what `train` pushes, for the steps that take the model version
# What an approval task pushes, for the `answer` step after it: a human's answer to its stage's question.
SAMPLE_ANSWER = {
    "question": "pause",
    "choice": "rollback",
    "option": "Roll back",
    "at": "2026-11-29T05:00:00+00:00",
    "by": "releaser",
}


def _sample_xcom(task_ids: str) -> Any:
    if task_ids.startswith("approve_"):
        return {**SAMPLE_ANSWER, "stage": int(task_ids.removeprefix("approve_"))}
    return SAMPLE_XCOM[task_ids]


def sample_context(task_id: str, context: dict[str, Any] | None = None, model: str | None = None) -> dict[str, Any]:
    """The context one task renders with: `context` (default: a sample run of `model`) plus the task instance `ti`."""
    ti = SimpleNamespace(task_id=task_id, try_number=1, xcom_pull=_sample_xcom)
    return {"ti": ti, **(context or sample_run(model or process_spec().name))}


def render_manifest(step: str, context: dict[str, Any] | None = None, model: str | None = None) -> dict[str, Any]:
    """The pod manifest (plain dict, API field names) that the KubernetesPodOperator would create for `step`.

    :param model: the model the step releases (default: this process's, MLRELEASE_MODEL).
    """
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment
    from kubernetes.client import ApiClient

    model = model or process_spec().name
    task_id = step.replace("-", "_")
    operator = kubernetes_step_operator(task_id, replace(STEPS[step], model=model), ClusterSettings.from_env())
    # Rendered as Airflow renders a task (arguments, env, every templated field); unknown names are errors.
    operator.render_template_fields(
        sample_context(task_id, context, model), jinja_env=SandboxedEnvironment(undefined=StrictUndefined)
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


def render_pods(out: str | Path, *, kubernetes_version: str, model: str | None = None) -> dict[str, Any]:
    """Write `<out>/<step>.yaml` for every catalogue step of `model` (default: this process's); fail naming any
    manifest that does not validate."""
    model = model or process_spec().name
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    written, problems = [], []
    for step in STEPS:
        manifest = render_manifest(step, model=model)
        problems += [f"{step}: {e}" for e in validation_errors(manifest, kubernetes_version)]
        path = out_dir / f"{step}.yaml"
        path.write_text(yaml.safe_dump(manifest, sort_keys=False), encoding="utf-8")
        written.append(str(path))
    if problems:
        raise StepError("invalid pod manifests: " + "; ".join(problems))
    return {"kubernetes_version": kubernetes_version, "model": model, "manifests": written}


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m mlrelease_airflow.render_pods --out DIR`: print the JSON result, or one error line and exit 2."""
    parser = argparse.ArgumentParser(
        prog="python -m mlrelease_airflow.render_pods",
        description="write and validate every step's Kubernetes pod manifest",
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--kubernetes-version", default="1.37.0")
    parser.add_argument("--model", help="the declared model whose pods to render (default: MLRELEASE_MODEL's)")
    args = parser.parse_args(argv)
    try:
        result = render_pods(args.out, kubernetes_version=args.kubernetes_version, model=args.model)
    except (StepError, ValueError, OSError) as exc:
        print(f"render-pods: error: {exc}", file=sys.stderr)
        return EXIT_STEP_ERROR
    print(json.dumps(result, indent=2, default=str))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
