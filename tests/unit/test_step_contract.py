"""One declaration per step, on either runner: every DAG task's rendered command parses with the real CLI, and
every step records its own outcome where it runs, so the report's step table is complete on Kubernetes too."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import subprocess
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from mlrelease.cli import build_parser, run
from mlrelease.errors import Skipped
from mlrelease.outcome import INTERVAL_END_ENV, RUN_ID_ENV, TASK_ID_ENV, TRY_NUMBER_ENV, StepRun, read_outcome
from mlrelease.release_spec import nightly_dag_id, spec_named
from mlrelease.report.collect import REPORT_TASK, step_lines
from mlrelease.report.inputs import run_outcomes
from mlrelease.settings import Settings
from mlrelease.stepdefs import STEPS, nightly_params, release_control_params
from mlrelease.timewindow import run_key
from mlrelease_airflow.local_runner import LocalStepOperator, resolve_entrypoint
from mlrelease_airflow.render_pods import sample_context, sample_run
from tests.conftest import REPO

NIGHTLY = nightly_dag_id("parcel_eta")
SAMPLE_CONTEXT = sample_run("parcel_eta")
# The DAGs whose every task is checked here, and the form each declares: one model's nightly DAG (every nightly DAG
# is built by the same function: tests/unit/test_dag.py checks what differs) and the rollback DAG.
FORMS = {
    NIGHTLY: nightly_params(spec_named("parcel_eta")),
    "rollback_release": release_control_params(("late_delivery", "parcel_eta")),
}
DAGS = tuple(FORMS)
IDENTITY = (TASK_ID_ENV, RUN_ID_ENV, TRY_NUMBER_ENV, INTERVAL_END_ENV)
# A manual run of the rollback DAG: a data interval of its own (schedule=None: the logical date), another run id.
RELEASE_CONTROL_CONTEXT = {
    **SAMPLE_CONTEXT,
    "data_interval_start": datetime(2026, 11, 30, 9, 15, tzinfo=UTC),
    "data_interval_end": datetime(2026, 11, 30, 9, 15, tzinfo=UTC),
    "run_id": "manual__2026-11-30T09:15:00+00:00",
}


def step_of(task: Any) -> str | None:
    """The `mlrelease step` a task runs (None for sensors and the like), on either runner."""
    cmds = task.pod.cmds if isinstance(task, LocalStepOperator) else getattr(task, "cmds", None)
    return cmds[2] if cmds and cmds[:2] == ["mlrelease", "step"] else None


def argv_of(task: Any) -> list[str]:
    """The rendered `mlrelease …` argv of a step task, without the program name."""
    return ["step", step_of(task), *[str(a) for a in task.arguments]]


def env_of(task: Any) -> dict[str, str]:
    """The rendered environment a step task gives its process (the local runner) or its container (a pod)."""
    if isinstance(task, LocalStepOperator):
        return dict(task.env_vars)
    return {e.name: e.value for e in task.env_vars}


def parse(argv: list[str]) -> Any:
    """`argv` parsed by the real `mlrelease` parser (never run); an argparse refusal fails the test with its message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"the CLI refuses {argv}: {err.getvalue().strip()}")


def dag_context(dag: Any, task_id: str) -> dict[str, Any]:
    """The sample run of `dag` as task `task_id` sees it: the DAG's own param defaults."""
    run = RELEASE_CONTROL_CONTEXT if dag.dag_id == "rollback_release" else SAMPLE_CONTEXT
    params = {name: dag.params[name] for name in dag.params}
    if dag.dag_id == "rollback_release":
        params["target_version"] = 6  # the form's optional version, as a rollback_to_version run gives it
    return sample_context(task_id, {**run, "params": params})


@functools.cache
def rendered_dags(runner: str) -> dict[str, Any]:
    """Both DAGs built with `runner`, every step task rendered (templates filled) as Airflow would for a run."""
    from airflow.dag_processing.dagbag import DagBag

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLRELEASE_RUNNER", runner)
        bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dags = {dag_id: bag.dags[dag_id] for dag_id in DAGS}
    for dag in dags.values():
        for task in dag.tasks:
            if step_of(task):
                task.render_template_fields(dag_context(dag, task.task_id))  # the DAG's StrictUndefined environment
    return dags


@pytest.fixture(params=["local", "kubernetes"])
def rendered(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    """(runner, both DAGs rendered with it), for each runner."""
    return request.param, rendered_dags(request.param)


def step_tasks(dag: Any) -> list[Any]:
    return [task for task in dag.tasks if step_of(task)]


def test_every_task_command_of_both_dags_parses_with_the_real_cli(rendered):
    runner, dags = rendered
    seen = set()
    for dag in dags.values():
        context_params = dag_context(dag, "any")["params"]
        for task in step_tasks(dag):
            argv = argv_of(task)
            assert not any("{{" in a for a in argv), (task.task_id, argv)
            args = parse(argv)
            declared = STEPS[args.step]
            assert declared.in_dag and args.step == step_of(task)
            # Every argument the catalogue passes arrives with the value the run meant (typed by the parser).
            for arg in declared.args:
                dest = arg.flag.lstrip("-").replace("-", "_")
                if arg.switch and arg.dag:
                    assert getattr(args, dest) is True, (task.task_id, arg.flag)
                elif isinstance(arg.dag, str) and (param := re.fullmatch(r"\{\{ params\.(\w+) \}\}", arg.dag)):
                    assert getattr(args, dest) == arg.type(context_params[param[1]]), (task.task_id, arg.flag)
            seen.add(args.step)
    assert seen == {name for name, step in STEPS.items() if step.in_dag}, runner  # every catalogue step is used


def test_the_dag_params_and_the_cli_share_their_defaults(rendered):
    _, dags = rendered
    for dag_id, params in FORMS.items():
        dag = dags[dag_id]
        assert list(dag.params) == [p.name for p in params]
        for p in params:
            assert dag.params[p.name] == p.default and dag.params.get_param(p.name).description == p.description
    train = parse(["step", "train", "--start", "2026-11-28", "--end", "2026-11-29"])
    bench = parse(["step", "benchmark", "--model-version", "1"])
    defaults = {p.name: p.default for p in FORMS[NIGHTLY]}
    assert (train.training_days, train.mae_tolerance) == (defaults["training_days"], defaults["mae_tolerance"])
    # The spec declares these: run by hand without the flag, the step takes its process model's spec's.
    assert (bench.max_p99_ratio, bench.min_throughput_ratio, bench.peak_concurrency) == (None, None, None)
    assert (defaults["max_p99_ratio"], defaults["min_throughput_ratio"]) == (1.10, 0.90)


def test_every_task_gives_its_step_the_task_identity(rendered):
    runner, dags = rendered
    for dag in dags.values():
        end = dag_context(dag, "any")["data_interval_end"]
        for task in step_tasks(dag):
            if runner == "kubernetes":  # what the pod really carries, as the KubernetesPodOperator builds it
                from kubernetes.client import ApiClient

                pod = ApiClient().sanitize_for_serialization(task.build_pod_request_obj(dry_run=True))
                (main,) = [c for c in pod["spec"]["containers"] if c["name"] == "base"]
                env = {e["name"]: e.get("value") for e in main["env"]}
            else:
                env = env_of(task)
            identity = {name: env[name] for name in IDENTITY}
            assert identity == {
                TASK_ID_ENV: task.task_id,
                RUN_ID_ENV: dag_context(dag, task.task_id)["run_id"],
                TRY_NUMBER_ENV: "1",
                INTERVAL_END_ENV: end.isoformat(),
            }, task.task_id


@pytest.mark.parametrize("runner", ["local", "kubernetes"])
def test_a_run_without_a_data_interval_passes_an_empty_end(runner, monkeypatch):
    """A manual run without a logical date has no data interval: its step records nothing (no folder to key)."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("MLRELEASE_RUNNER", runner)
    dag = DagBag(dag_folder=str(REPO / "dags")).dags["rollback_release"]
    (task,) = dag.tasks
    context = dag_context(dag, task.task_id)
    del context["data_interval_start"], context["data_interval_end"]  # Airflow leaves them out of such a run
    task.render_template_fields(context)
    assert env_of(task)[INTERVAL_END_ENV] == "" and env_of(task)[TASK_ID_ENV] == "manual_release"


def _stub(status: str) -> Any:
    """A handler standing in for a step's work: a small result, or nothing to do."""

    def handler(args: Any, settings: Settings) -> dict[str, Any]:
        if status == "skipped":
            raise Skipped("nothing to do here")
        return {"status": "ok", "model_version": 7}

    return handler


def test_each_pod_commands_outcome_path_completes_the_reports_step_table(home, monkeypatch, capsys):
    """Every task of both DAGs on Kubernetes: its command, with its pod's identity env, records what it did."""
    dags = rendered_dags("kubernetes")
    settings = Settings.from_env()
    for dag in dags.values():
        expected = {}
        for task in step_tasks(dag):
            env = env_of(task)
            for name in IDENTITY:
                monkeypatch.setenv(name, env[name])
            status = "skipped" if task.task_id in ("rollback", "manual_release") else "success"
            args = parse(argv_of(task))
            assert run(_stub(status), args) == (4 if status == "skipped" else 0), task.task_id
            expected[task.task_id] = status
        key = run_key(dag_context(dag, "any")["data_interval_end"])
        outcomes = run_outcomes(settings, key)
        assert {task: o["status"] for task, o in outcomes.items()} == expected
        lines = {line.task: line.status for line in step_lines(outcomes)}
        # The step table: every step task of the DAG (the report's own task aside) with its status.
        assert {t: s for t, s in lines.items() if s != "not run"} == {
            task: status for task, status in expected.items() if task != REPORT_TASK
        }
        if dag.dag_id == NIGHTLY:
            assert "not run" not in lines.values()  # the table lists the nightly steps: all of them ran
        assert {o["run_id"] for o in outcomes.values()} == {dag_context(dag, "any")["run_id"]}
    capsys.readouterr()


def test_a_real_step_process_records_its_outcome_for_the_report(home):
    """`mlrelease step rollback` as a process, with the env its pod carries: it skips and says so in its record."""
    dag = rendered_dags("kubernetes")[NIGHTLY]
    task = dag.get_task("rollback")
    env = {**os.environ, **{name: env_of(task)[name] for name in IDENTITY}}
    proc = subprocess.run(
        [resolve_entrypoint("mlrelease"), *argv_of(task)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 4, proc.stderr
    key = run_key(dag_context(dag, "rollback")["data_interval_end"])
    outcome = run_outcomes(Settings.from_env(), key)["rollback"]
    assert outcome["status"] == "skipped" and "nothing to roll back" in outcome["reason"]
    assert outcome["recorded_by"] == "step" and outcome["exit_code"] == 4 and outcome["try_number"] == 1
    assert outcome["run_id"] == SAMPLE_CONTEXT["run_id"] and outcome["step"] == "rollback"
    assert proc.stderr.strip().splitlines()[-1] == outcome["reason"]  # the one line the runner reports
    (line,) = [line for line in step_lines({"rollback": outcome}) if line.task == "rollback"]
    assert line.status == "skipped" and "nothing to roll back" in line.detail
    assert json.loads((home / "artifacts" / "parcel_eta" / key / "steps" / "rollback.json").read_text()) == outcome


# ---- the local runner: the step is the one writer, the runner fills in a try the step could not record ----------


def _local(task_id: str, step: str, try_number: int = 1, model: str = "parcel_eta") -> LocalStepOperator:
    """A local step operator of `model`'s DAG rendered for the sample run (try `try_number`)."""
    from mlrelease_airflow.catalog import STEPS as PODS

    op = LocalStepOperator(task_id=task_id, pod=replace(PODS[step], model=model))
    context = sample_context(task_id)
    context["ti"].try_number = try_number
    op.render_template_fields(context)
    return op


def test_the_local_runner_leaves_the_record_to_the_step(home):
    from airflow.sdk.exceptions import AirflowException

    op = _local("check_freshness", "check-freshness")
    op.arguments = ["--end", "not-a-time"]  # the step's own check: it fails in its main and records that
    with pytest.raises(AirflowException, match="bad --end 'not-a-time'") as err:
        op.execute({})
    outcome = StepRun.from_env(op.env_vars).recorded(Settings.from_env())
    assert outcome["recorded_by"] == "step" and outcome["exit_code"] == 2 and outcome["status"] == "failed"
    assert outcome["error"] == str(err.value)  # what the task says is what the record says


def test_the_local_runner_records_a_try_the_step_could_not(home):
    from airflow.sdk.exceptions import AirflowException

    settings = Settings.from_env()
    earlier = StepRun("check_freshness", SAMPLE_CONTEXT["run_id"], run_key(SAMPLE_CONTEXT["data_interval_end"]), 1)
    earlier.record(settings, "check-freshness", {"status": "success", "result": {}}, exit_code=0)
    op = _local("check_freshness", "check-freshness", try_number=2)
    op.arguments = ["--no-such-flag"]  # argparse refuses it before the step's main: the step records nothing
    with pytest.raises(AirflowException, match="check-freshness: error: "):
        op.execute({})
    outcome = read_outcome(earlier.path(settings))
    assert outcome["recorded_by"] == "runner" and outcome["try_number"] == 2  # try 1's success is replaced
    assert outcome["status"] == "failed" and outcome["exit_code"] == 2 and outcome["task_id"] == "check_freshness"


def test_each_models_steps_record_under_that_model_whatever_the_workers_model(home):
    """One Airflow worker runs every model's tasks: a task of late_delivery's DAG records under late_delivery, both
    where the step records (its process releases the pod's model) and where the runner records for it."""
    from airflow.sdk.exceptions import AirflowException

    assert os.environ["MLRELEASE_MODEL"] == "parcel_eta"  # the worker's own
    ours = Settings.from_env().for_model("late_delivery")
    for arguments, recorded_by in ((["--end", "not-a-time"], "step"), (["--no-such-flag"], "runner")):
        op = _local("check_freshness", "check-freshness", model="late_delivery")
        op.arguments = arguments
        with pytest.raises(AirflowException):
            op.execute({})
        step_run = StepRun.from_env(op.env_vars)
        outcome = step_run.recorded(ours)
        assert outcome["recorded_by"] == recorded_by and outcome["status"] == "failed", arguments
        assert step_run.recorded(Settings.from_env()) is None  # nothing under the worker's model
        step_run.path(ours).unlink()
