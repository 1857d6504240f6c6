"""One nightly retrain-and-release DAG per declared model (`models/<name>/release.yaml`): wiring only, every step
runs `mlrelease step …` for the DAG's model.

Generated from the specs folder, as Airflow users generate DAGs from configuration: parsing reads the small spec
and plan YAML files and nothing else. A spec that does not load is logged with its error and gets no DAG; the
other models' DAGs are unaffected (one bad spec never blocks the others).
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.sensors.date_time import DateTimeSensorAsync
from airflow.sdk import DAG, CronDataIntervalTimetable, TriggerRule, chain

from mlrelease.errors import StepError
from mlrelease.release_spec import ReleaseSpec, declared_specs, nightly_dag_id
from mlrelease.rollout.plan import load_plan
from mlrelease.stepdefs import nightly_params
from mlrelease_airflow.approval import StageApproval
from mlrelease_airflow.assets import FEATURE_ASSETS, champion_model
from mlrelease_airflow.catalog import dag_params, params_table
from mlrelease_airflow.factory import step_operator
from mlrelease_airflow.notifiers import release_alerts

log = logging.getLogger(__name__)

DOC = """
### Nightly release of `{model}`

{description}

On the spec's schedule (`{schedule}`, UTC), for the data interval that just closed:

1. **apply_features** registers the Feast repository (`feature_repo/`), removing what it no longer defines.
2. **validate_data** gates every source partition the run will load or train on, before anything reads it:
   the contract (columns, types, UTC-aware event times), the Great Expectations suites of `config/gx/`
   (event times inside their day, completeness against each table's own history, keys unique within and
   across partitions, referential integrity, collapsed distributions, ranges and units) and drift per
   partition and over the interval. A failure stops the release with one line per finding; passed
   partitions are approved by SHA-256, and only approved bytes are materialized or trained on.
3. **materialize** loads exactly the interval (plus an overlap for late rows) into the online store and
   updates one Airflow Asset per feature view (`feast://mlrelease/<view>`).
4. **check_freshness** fails if any feature view's newest event is older than its budget
   (the `freshness_budget_hours` tag on the view) at the interval's end.
5. **train** fits a candidate on point-in-time-correct features (Feast feature service), evaluates it on a
   time-ordered holdout against the `champion`, logs everything to MLflow and registers it as `challenger`
   (or refuses it, with the numbers).
6. **export** writes ONNX (checked, parity-tested) and an immutable version into the Triton model repository.
7. **validate_serving** loads it into a real Triton and compares served answers with the export.
8. **benchmark** runs perf_analyzer on challenger and champion (GPU node on Kubernetes) and gates on p99
   latency and throughput ratios. With no champion yet, the first candidate that passes every gate
   becomes champion (bootstrap), and the rollout tasks are skipped.
9. **shadow** replays the interval's orders through candidate and champion on Triton and gates on the
   share of differing answers, a KS test, each cohort's ETA shift on the same orders and a sequential
   paired latency test.
10. **rollout_stage_N → wait_N → analyze_N** for each stage of the rollout plan (the release spec's
    `rollout_plan`: `{plan}`):
    high-value cohort, then the long tail, then everyone, each judged cohort keeping a concurrent control
    slice on stable. `analyze_N` looks once per execution and defers between looks (no worker is held):
    every guardrail is a sequential test with a tolerance and a false-verdict rate; it rolls back as soon
    as a fail is established, advances as soon as everything passed after the minimum exposure, rolls one
    cohort back (and diagnoses it), or pauses for a human.
    **approve_N → answer_N**: when the stage paused (or passed, under a plan with
    `approval.confirm_promotion`), approve_N asks on the run's **Required Actions** page, with the evidence
    (each contract's band against its tolerance, the outage if any, the report link): *Promote* (past the
    stage: the next stage, or champion after the last), *Roll back*, or *Extend the stage* (another maximum
    exposure). Unanswered after the plan's `approval.timeout_s`, its `approval.default` (roll back) is taken.
    answer_N records the answer (who, when) in the rollout record and carries it out. With nothing to ask
    both skip themselves at once.
11. **promote** moves the `champion` alias (all traffic first) and updates the Asset
    `models:/{model}@champion` (other DAGs may be scheduled on it, or on a feature view's asset: build them
    with `mlrelease_airflow.assets`); **retire** unloads the previous champion once its keep window (instant
    rollback) has passed.
12. **rollback** runs only when a rollout task up to the promotion failed: traffic back to stable, candidate
    unloaded, aliases restored.
13. **report** writes the run's release report (data quality, metrics vs champion, benchmark curves, shadow,
    rollout timeline) and logs it to MLflow once the release is decided (after promote or rollback); it never
    changes the run's verdict (`release_complete`). The "Release report" link on every task opens it.

Each task runs as a KubernetesPodOperator when `MLRELEASE_RUNNER=kubernetes` (deferrable unless
`MLRELEASE_K8S_DEFERRABLE=false`; on the pod template `MLRELEASE_K8S_POD_TEMPLATE_FILE` when set), otherwise
as a local process running the same command. Alerts go to the channels configured as Airflow connections:
`mlrelease_alerts` (generic webhook), `mlrelease_slack` (Slack incoming webhook), `mlrelease_smtp` (e-mail).

#### Parameters (manual trigger form)
"""


def nightly_release(spec: ReleaseSpec) -> DAG:
    """Model `spec`'s nightly release DAG: its form, schedule, plan's stages, alerts and report."""
    model = spec.name
    params = nightly_params(spec)  # declared once, with the steps' arguments; defaults from the spec
    # One task triple per stage of the spec's plan; a run given another plan with another number of stages is
    # refused by the rollout step (it checks --wired-stages).
    stages = len(load_plan(spec.rollout_plan_path).stages)
    doc = DOC.format(model=model, description=spec.description, plan=spec.rollout_plan, schedule=spec.schedule)
    with DAG(
        dag_id=nightly_dag_id(model),
        description=f"Feast materialization, freshness and data-quality gates, then train and release {model}",
        schedule=CronDataIntervalTimetable(spec.schedule, timezone="UTC"),
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_runs=1,
        doc_md=doc + params_table(params),
        tags=["mlrelease", "release", f"model:{model}"],
        default_args={
            "owner": "ml-platform",
            "retries": int(os.environ.get("MLRELEASE_TASK_RETRIES", "2")),
            "retry_delay": timedelta(minutes=5),
            "on_failure_callback": release_alerts("task_failed"),
        },
        # Defaults, types, bounds and descriptions come from the steps' declarations (mlrelease.stepdefs).
        params=dag_params(params),
    ) as dag:
        _wire(model, stages)
    return dag


def _wire(model: str, stages: int) -> None:
    """The tasks of one model's nightly DAG (inside its `with DAG` block), each running a step for `model`."""

    def step(name: str, **kwargs: Any) -> Any:
        return step_operator(name, model=model, **kwargs)

    paused_alert = release_alerts("task_skipped")
    chain(
        step("apply-features"),
        step("validate-data"),
        step("materialize", outlets=list(FEATURE_ASSETS)),
        step("check-freshness"),
        step("train"),
        step("export"),
        step("validate-serving"),
        benchmark := step("benchmark"),
    )
    shadow = step("shadow")
    benchmark >> shadow
    decided: list[Any] = [shadow]  # what the next stage opens after: the analysis, and the answer when it asked
    rollout_tasks: list[Any] = [shadow]
    for n in range(1, stages + 1):
        # After a stage that asked a human, the next one opens once the answer was carried out (none_failed…: the
        # answer task is skipped when nothing was asked, and the analysis alone decided).
        opens = step(
            "rollout-stage",
            task_id=f"rollout_stage_{n}",
            extra_args=("--stage", str(n), "--wired-stages", str(stages)),
            trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS if n > 1 else TriggerRule.ALL_SUCCESS,
        )
        wait = DateTimeSensorAsync(
            task_id=f"wait_{n}",
            target_time=f"{{{{ ti.xcom_pull(task_ids='rollout_stage_{n}')['analyze_at'] }}}}",
        )
        analyze = step("analyze", task_id=f"analyze_{n}", extra_args=("--stage", str(n)))
        approve = StageApproval(task_id=f"approve_{n}", stage=n, analysis_task=f"analyze_{n}")
        answer = step(
            "answer",
            task_id=f"answer_{n}",
            extra_args=("--stage", str(n), "--answer", f"{{{{ ti.xcom_pull(task_ids='approve_{n}') | tojson }}}}"),
            on_skipped_callback=paused_alert,  # an extended stage that paused again: rollback_release decides
        )
        decided >> opens
        chain(opens, wait, analyze, approve, answer)
        decided = [analyze, answer]
        rollout_tasks += [opens, wait, analyze, approve, answer]
    wait_retire = DateTimeSensorAsync(
        task_id="wait_retire", target_time="{{ ti.xcom_pull(task_ids='promote')['previous_unload_after'] }}"
    )
    promote = step(
        "promote",
        outlets=[champion_model(model)],
        on_success_callback=release_alerts("promoted"),
        trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
    )
    retire = step("retire")
    decided >> promote
    chain(promote, wait_retire, retire)
    # Any failed rollout task up to the promotion: traffic back to stable and the candidate cleaned up (a
    # no-op when nothing moved). Not after it: once promoted, a failed retire only alerts (the keep window
    # of the old champion is an unload, not a release decision), and rollback is decided at promotion
    # rather than a keep window (24 h in production) later.
    rollback = step(
        "rollback",
        trigger_rule=TriggerRule.ONE_FAILED,
        retries=3,
        on_success_callback=release_alerts("rolled_back"),
    )
    [*rollout_tasks, promote] >> rollback
    # The run's verdict (the only leaf): failed whenever any task failed, even though a rollback succeeded;
    # green after a promotion, a first release or a pause (those end the rollout tasks as skipped).
    # none_failed waits for both upstreams, where all_success would turn skipped at the first skipped one.
    release_complete = EmptyOperator(task_id="release_complete", trigger_rule=TriggerRule.NONE_FAILED)
    [retire, rollback] >> release_complete
    # The release report, as soon as the release is decided: promoted, rolled back, or stopped earlier (a
    # failed or stopped run gets one too), so the promotion and rollback alerts link a page that exists. As a
    # teardown it is left out of the run's state: release_complete stays the verdict, a report problem never
    # turns it.
    [promote, rollback] >> step("report").as_teardown()


def _declare_nightly_dags() -> None:
    """Put one nightly DAG per loadable spec in this module's globals (where the DagBag finds DAGs)."""
    for folder, spec in declared_specs().items():
        if isinstance(spec, StepError):
            log.error("no nightly DAG for model folder %s: %s", folder, spec)
            continue
        try:
            dag = nightly_release(spec)
        except StepError as exc:  # e.g. its rollout plan does not load
            log.error("no nightly DAG for model %s: %s", spec.name, exc)
            continue
        globals()[dag.dag_id] = dag


_declare_nightly_dags()
