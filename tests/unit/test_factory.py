"""The runner switch: one catalogue step becomes a local operator or a KubernetesPodOperator."""

from __future__ import annotations

import json

import pytest

from mlrelease_airflow.catalog import STEPS
from mlrelease_airflow.factory import selected_runner, step_operator
from mlrelease_airflow.local_runner import LocalStepOperator, _error_line


def test_local_runner_is_the_default_and_carries_the_pod_command(monkeypatch):
    monkeypatch.delenv("MLRELEASE_RUNNER", raising=False)
    op = step_operator("materialize", model="parcel_eta")
    assert isinstance(op, LocalStepOperator)
    assert op.task_id == "materialize"
    assert op.pod.cmds == ["mlrelease", "step", "materialize"]
    assert op.arguments[:2] == ["--start", "{{ data_interval_start.isoformat() }}"]
    assert "arguments" in op.template_fields


def test_kubernetes_runner_builds_a_pod_operator_with_the_same_command(monkeypatch):
    monkeypatch.setenv("MLRELEASE_RUNNER", "kubernetes")
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    op = step_operator("validate-data", model="parcel_eta")
    assert isinstance(op, KubernetesPodOperator) and type(op).__name__ == "StepPodOperator"
    assert op.cmds == ["mlrelease", "step", "validate-data"]
    assert op.arguments == list(STEPS["validate-data"].args)
    assert op.do_xcom_push


def test_unknown_runner_or_step_is_refused(monkeypatch):
    monkeypatch.setenv("MLRELEASE_RUNNER", "docker")
    with pytest.raises(ValueError, match="MLRELEASE_RUNNER must be one of local, kubernetes; got 'docker'"):
        selected_runner()
    with pytest.raises(KeyError, match="unknown step 'train-now'"):
        step_operator("train-now", model="parcel_eta", runner="local")


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
    op = step_operator("validate-data", model="parcel_eta", runner="kubernetes")
    with pytest.raises(AirflowException) as err:
        op.cleanup(None, _pod_with_exit(exit_code))
    assert type(err.value).__name__ == expected


def test_kubernetes_pods_skip_on_the_steps_nothing_to_do_exit_code():
    op = step_operator("analyze", model="parcel_eta", runner="kubernetes", extra_args=("--stage", "2"))
    assert 4 in op.skip_on_exit_code
    assert op.arguments[-2:] == ["--stage", "2"]


# --- deferrable mode --------------------------------------------------------------------------------------


def test_kubernetes_pods_are_deferrable_unless_switched_off(monkeypatch):
    monkeypatch.delenv("MLRELEASE_K8S_DEFERRABLE", raising=False)
    assert step_operator("train", model="parcel_eta", runner="kubernetes").deferrable is True
    monkeypatch.setenv("MLRELEASE_K8S_DEFERRABLE", "false")
    assert step_operator("train", model="parcel_eta", runner="kubernetes").deferrable is False
    monkeypatch.setenv("MLRELEASE_K8S_DEFERRABLE", "maybe")
    with pytest.raises(ValueError, match="MLRELEASE_K8S_DEFERRABLE must be one of .*; got 'maybe'"):
        step_operator("train", model="parcel_eta", runner="kubernetes")


def _finished_pod(exit_code: int):
    """A pod whose step container ended with `exit_code` (the XCom sidecar still running, as KPO expects)."""
    from kubernetes.client import models as k8s

    def status(name, state):
        return k8s.V1ContainerStatus(name=name, state=state, image="i", image_id="", ready=False, restart_count=0)

    terminated = k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(exit_code=exit_code))
    running = k8s.V1ContainerState(running=k8s.V1ContainerStateRunning())
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="mlrelease-analyze-x", namespace="mlrelease", labels={}),
        spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base"), k8s.V1Container(name="airflow-xcom-sidecar")]),
        status=k8s.V1PodStatus(
            phase="Succeeded" if exit_code == 0 else "Failed",
            container_statuses=[status("base", terminated), status("airflow-xcom-sidecar", running)],
        ),
    )


class FakeCluster:
    """What the operator's re-entry talks to (hook, pod manager, API client), answering from one finished pod."""

    def __init__(self, pod, xcom: dict):
        self.pod, self.xcom, self.deleted = pod, xcom, []

    def get_pod(self, name, namespace):
        return self.pod

    read_pod = await_pod_completion = lambda self, pod, *args, **kwargs: self.pod  # noqa: E731

    def extract_xcom(self, pod, **kwargs):
        return json.dumps(self.xcom)

    def delete_pod(self, pod):
        self.deleted.append(pod.metadata.name)

    def read_namespaced_pod_log(self, **kwargs):
        return [b"mlrelease step analyze: done\n"]

    def patch_namespaced_pod(self, **kwargs):
        pass


def _reenter(exit_code: int, xcom: dict):
    """Resume a deferrable step operator as Airflow does when the pod trigger fires (`trigger_reentry`)."""
    from types import SimpleNamespace

    op = step_operator("analyze", model="parcel_eta", runner="kubernetes", extra_args=("--stage", "2"))
    assert op.deferrable
    cluster = FakeCluster(_finished_pod(exit_code), xcom)
    for name in ("hook", "pod_manager", "client"):  # cached properties of the provider's operator
        op.__dict__[name] = cluster
    pushed = []
    ti = SimpleNamespace(xcom_push=lambda key, value: pushed.append((key, value)))
    event = {
        "status": "success" if exit_code == 0 else "failed",
        "name": "mlrelease-analyze-x",
        "namespace": "mlrelease",
        "message": "done",
    }
    return op, cluster, lambda: op.trigger_reentry({"ti": ti}, event)


@pytest.mark.parametrize(
    ("exit_code", "expected"),
    [(3, "AirflowFailException"), (4, "AirflowSkipException"), (2, "AirflowException")],
)
def test_deferred_pods_map_exit_codes_as_synchronous_ones(exit_code, expected):
    """The provider's re-entry raises "pod failed"; the cleanup it ends in decides: skip, fail, or retry."""
    op, cluster, reenter = _reenter(exit_code, {"status": "failed"})
    with pytest.raises(BaseException) as err:  # noqa: B017 - the exact type is the assertion
        reenter()
    assert type(err.value).__name__ == expected
    assert cluster.deleted == []  # a failed pod is kept for `kubectl describe`


def test_a_deferred_tick_that_has_not_decided_defers_again_until_its_next_check():
    from airflow.sdk.exceptions import TaskDeferred

    undecided = {"decided": False, "next_check_at": "2026-11-29T03:00:00+00:00", "reason": "gathering"}
    op, cluster, reenter = _reenter(0, undecided)
    with pytest.raises(TaskDeferred) as deferred:
        reenter()
    assert deferred.value.method_name == "execute_again"
    assert type(deferred.value.trigger).__name__ == "DateTimeTrigger"
    assert cluster.deleted == ["mlrelease-analyze-x"]  # the tick's pod is done and gone
    # A decided tick returns its result (pushed as the task's XCom by Airflow).
    op, _, reenter = _reenter(0, {"decided": True, "action": "advance"})
    assert reenter() == {"decided": True, "action": "advance"}
    assert op._reentry_result == {"decided": True, "action": "advance"}


def test_a_look_is_never_deferred_by_less_than_the_floor():
    from datetime import UTC, datetime, timedelta

    from airflow.sdk.exceptions import TaskDeferred

    from mlrelease_airflow.ticks import MIN_DEFERRAL, defer_until_next_check

    class Operator:
        log = __import__("logging").getLogger("test")

        def defer(self, *, trigger, method_name):
            raise TaskDeferred(trigger=trigger, method_name=method_name)

    now = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
    soon = {"decided": False, "next_check_at": (now + timedelta(seconds=2)).isoformat()}
    later = {"decided": False, "next_check_at": (now + timedelta(minutes=5)).isoformat()}
    for result, expected in ((soon, now + MIN_DEFERRAL), (later, now + timedelta(minutes=5))):
        with pytest.raises(TaskDeferred) as deferred:
            defer_until_next_check(Operator(), result, now=now)
        assert deferred.value.trigger.moment == expected
    assert defer_until_next_check(Operator(), {"decided": True}, now=now) is None


def test_a_pod_finished_before_deferring_keeps_its_result(monkeypatch):
    """The provider re-enters at once for a pod already done, and drops what re-entry returns: ours keeps it."""
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    op, _, reenter = _reenter(0, {"decided": True, "action": "advance"})
    monkeypatch.setattr(KubernetesPodOperator, "execute", lambda self, context: reenter() and None)
    assert op.execute({}) == {"decided": True, "action": "advance"}
