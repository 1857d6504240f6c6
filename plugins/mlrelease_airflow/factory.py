"""The one place that decides where a step runs: a KubernetesPodOperator or a local process."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from mlrelease_airflow.catalog import STEPS
from mlrelease_airflow.pod_spec import ClusterSettings, StepPod

RUNNERS = ("local", "kubernetes")


def selected_runner() -> str:
    """The runner named by MLRELEASE_RUNNER (default `local`); an unknown name is an error."""
    runner = os.environ.get("MLRELEASE_RUNNER", "local")
    if runner not in RUNNERS:
        raise ValueError(f"MLRELEASE_RUNNER must be one of {', '.join(RUNNERS)}; got {runner!r}")
    return runner


def step_operator(
    step: str,
    *,
    model: str,
    task_id: str | None = None,
    runner: str | None = None,
    extra_args: tuple[str, ...] = (),
    **kwargs: Any,
) -> Any:
    """An operator that runs catalogue step `step` for model `model` with the selected runner.

    :param model: the declared model the step releases (its process's MLRELEASE_MODEL; may be a template).
    :param extra_args: appended to the step's catalogue args (e.g. `--stage 2` for one rollout stage).
    :param kwargs: passed to the operator (trigger_rule, callbacks…).
    """
    if step not in STEPS:
        raise KeyError(f"unknown step {step!r}; known steps: {', '.join(sorted(STEPS))}")
    pod: StepPod = replace(STEPS[step], model=model)
    if extra_args:
        pod = replace(pod, args=(*pod.args, *extra_args))
    task_id = task_id or step.replace("-", "_")
    if (runner or selected_runner()) == "kubernetes":
        from mlrelease_airflow.kubernetes import kubernetes_step_operator

        return kubernetes_step_operator(task_id, pod, ClusterSettings.from_env(), **kwargs)
    from mlrelease_airflow.local_runner import LocalStepOperator

    return LocalStepOperator(task_id=task_id, pod=pod, **kwargs)
