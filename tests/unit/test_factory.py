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
    op = step_operator("validate-data")
    assert type(op).__name__ == "KubernetesPodOperator"
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
