"""The runner switch: one catalogue step becomes a local operator or a KubernetesPodOperator."""

from __future__ import annotations

import pytest

from mlrelease_airflow.catalog import STEPS
from mlrelease_airflow.factory import selected_runner, step_operator
from mlrelease_airflow.local_runner import LocalStepOperator, _error_line


def test_local_runner_is_the_default_and_carries_the_pod_command(monkeypatch):
    monkeypatch.delenv("MLRELEASE_RUNNER", raising=False)
    op = step_operator("materialize")
    assert isinstance(op, LocalStepOperator)
    assert op.task_id == "materialize"
    assert op.pod.cmds == ["mlrelease", "step", "materialize"]
    assert op.arguments[:2] == ["--start", "{{ data_interval_start.isoformat() }}"]
    assert "arguments" in op.template_fields


def test_kubernetes_runner_builds_a_pod_operator_with_the_same_command(monkeypatch):
    monkeypatch.setenv("MLRELEASE_RUNNER", "kubernetes")
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    op = step_operator("validate-data")
    assert isinstance(op, KubernetesPodOperator) and type(op).__name__ == "StepPodOperator"
    assert op.cmds == ["mlrelease", "step", "validate-data"]
    assert op.arguments == list(STEPS["validate-data"].args)
    assert op.do_xcom_push


def test_unknown_runner_or_step_is_refused(monkeypatch):
    monkeypatch.setenv("MLRELEASE_RUNNER", "docker")
    with pytest.raises(ValueError, match="MLRELEASE_RUNNER must be one of local, kubernetes; got 'docker'"):
        selected_runner()
    with pytest.raises(KeyError, match="unknown step 'train-now'"):
        step_operator("train-now", runner="local")


def test_error_line_prefers_the_steps_own_message():
    stderr = "Traceback ...\nmlrelease step materialize: error: source routes: partition date=2026-11-28 is missing\n"
    assert (
        _error_line(stderr) == "mlrelease step materialize: error: source routes: partition date=2026-11-28 is missing"
    )
    assert _error_line("boom\nlast words\n") == "last words"
    assert _error_line("") == ""


def _pod_with_exit(code):
    from kubernetes.client import models as k8s

    terminated = k8s.V1ContainerStateTerminated(exit_code=code)
    status = k8s.V1ContainerStatus(
        name="base",
        state=k8s.V1ContainerState(terminated=terminated),
        image="i",
        image_id="",
        ready=False,
        restart_count=0,
    )
    return k8s.V1Pod(status=k8s.V1PodStatus(container_statuses=[status]))


@pytest.mark.parametrize(("exit_code", "expected"), [(3, "AirflowFailException"), (2, "AirflowException")])
def test_kubernetes_gate_verdicts_fail_without_retry(monkeypatch, exit_code, expected):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from airflow.sdk.exceptions import AirflowException

    def failed_pod(self, pod, remote_pod, *args, **kwargs):
        raise AirflowException("Pod mlrelease-validate-data returned a failure.")

    monkeypatch.setattr(KubernetesPodOperator, "cleanup", failed_pod)
    op = step_operator("validate-data", runner="kubernetes")
    with pytest.raises(AirflowException) as err:
        op.cleanup(None, _pod_with_exit(exit_code))
    assert type(err.value).__name__ == expected


def test_kubernetes_pods_skip_on_the_steps_nothing_to_do_exit_code():
    op = step_operator("analyze", runner="kubernetes", extra_args=("--stage", "2"))
    assert 4 in op.skip_on_exit_code
    assert op.arguments[-2:] == ["--stage", "2"]
