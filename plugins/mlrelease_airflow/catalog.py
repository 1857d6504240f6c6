"""The steps of the nightly release and how each is parameterised from the DAG run.

Arguments are Jinja templates rendered by Airflow per run, so every step is keyed on the run's
data interval (never on the wall clock) and a retry repeats exactly the same work.
"""

from __future__ import annotations

from mlrelease_airflow.pod_spec import Resources, StepPod

MODEL_VERSION_ARGS = ("--model-version", "{{ ti.xcom_pull(task_ids='train')['model_version'] }}")
WINDOW_ARGS = ("--start", "{{ data_interval_start.isoformat() }}", "--end", "{{ data_interval_end.isoformat() }}")
# Rollout steps are keyed on the candidate and the run's data interval end (one rollout per run).
RELEASE_ARGS = (*MODEL_VERSION_ARGS, "--end", "{{ data_interval_end.isoformat() }}")
PLAN_ARGS = ("--plan", "{{ params.rollout_plan }}")
SMALL = Resources(cpu="250m", memory="512Mi")

STEPS: dict[str, StepPod] = {
    "apply-features": StepPod("apply-features", resources=Resources(cpu="250m", memory="512Mi")),
    "materialize": StepPod(
        "materialize",
        args=(*WINDOW_ARGS, "--overlap-hours", "{{ params.materialize_overlap_hours }}"),
        resources=Resources(cpu="1", memory="2Gi", cpu_limit="2", memory_limit="4Gi"),
    ),
    "check-freshness": StepPod(
        "check-freshness",
        args=("--end", "{{ data_interval_end.isoformat() }}"),
        resources=Resources(cpu="250m", memory="512Mi"),
    ),
    "validate-data": StepPod(
        "validate-data",
        args=(
            *WINDOW_ARGS,
            "--overlap-hours",
            "{{ params.materialize_overlap_hours }}",
            "--training-days",
            "{{ params.training_days }}",
            "--reference-days",
            "{{ params.reference_days }}",
            "--psi-threshold",
            "{{ params.psi_threshold }}",
        ),
        resources=Resources(cpu="1", memory="2Gi", cpu_limit="2", memory_limit="4Gi"),
    ),
    "train": StepPod(
        "train",
        args=(
            *WINDOW_ARGS,
            "--training-days",
            "{{ params.training_days }}",
            "--mae-tolerance",
            "{{ params.mae_tolerance }}",
        ),
        resources=Resources(cpu="2", memory="4Gi", cpu_limit="4", memory_limit="8Gi"),
    ),
    "export": StepPod("export", args=MODEL_VERSION_ARGS, resources=Resources(cpu="1", memory="2Gi")),
    "validate-serving": StepPod(
        "validate-serving", args=MODEL_VERSION_ARGS, resources=Resources(cpu="250m", memory="512Mi")
    ),
    "benchmark": StepPod(
        "benchmark",
        args=(
            *MODEL_VERSION_ARGS,
            "--max-p99-ratio",
            "{{ params.max_p99_ratio }}",
            "--min-throughput-ratio",
            "{{ params.min_throughput_ratio }}",
        ),
        # perf_analyzer runs on a GPU node next to the GPU Triton it measures, from the Triton SDK image.
        resources=Resources(cpu="2", memory="2Gi", cpu_limit="4", memory_limit="4Gi", gpus=1),
        image_env="MLRELEASE_K8S_PERF_IMAGE",
    ),
    "shadow": StepPod("shadow", args=(*RELEASE_ARGS, *PLAN_ARGS), resources=Resources(cpu="1", memory="1Gi")),
    # `--stage N` is appended per stage by the DAG (step_operator's extra_args).
    "rollout-stage": StepPod(
        "rollout-stage",
        args=(*RELEASE_ARGS, "--profile", "{{ params.rollout_profile }}", *PLAN_ARGS),
        resources=SMALL,
        routes_traffic=True,
    ),
    # One look per pod (`--tick`): while undecided the operator defers until the step's next_check_at.
    "analyze": StepPod(
        "analyze", args=(*RELEASE_ARGS, "--tick"), resources=Resources(cpu="500m", memory="1Gi"), routes_traffic=True
    ),
    "promote": StepPod("promote", args=RELEASE_ARGS, resources=SMALL, routes_traffic=True),
    "retire": StepPod("retire", args=RELEASE_ARGS, resources=SMALL, routes_traffic=True),
    "rollback": StepPod(
        "rollback",
        args=("--end", "{{ data_interval_end.isoformat() }}", "--reason", "nightly_release run {{ run_id }} failed"),
        resources=SMALL,
        routes_traffic=True,
    ),
    # The release report of the run, whatever its outcome (a teardown: it never changes the run's verdict).
    "report": StepPod("report", args=("--end", "{{ data_interval_end.isoformat() }}"), resources=SMALL),
    # The rollback_release DAG: a human's rollback, abort or promotion, with the trigger form's params.
    "manual-release": StepPod(
        "manual-release",
        args=(
            "--action",
            "{{ params.action }}",
            "--model",
            "{{ params.model }}",
            "--to-version",
            "{{ params.target_version or '' }}",
            "--reason",
            "{{ params.reason }} (rollback_release run {{ run_id }})",
        ),
        resources=SMALL,
        routes_traffic=True,
    ),
}
