"""The steps of the nightly release and how each is parameterised from the DAG run.

Arguments are Jinja templates rendered by Airflow per run, so every step is keyed on the run's
data interval (never on the wall clock) and a retry repeats exactly the same work.
"""

from __future__ import annotations

from mlrelease_airflow.pod_spec import Resources, StepPod

MODEL_VERSION_ARGS = ("--model-version", "{{ ti.xcom_pull(task_ids='train')['model_version'] }}")
WINDOW_ARGS = ("--start", "{{ data_interval_start.isoformat() }}", "--end", "{{ data_interval_end.isoformat() }}")

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
}
