"""The steps of the nightly release and how each is parameterised from the DAG run.

Arguments are Jinja templates rendered by Airflow per run, so every step is keyed on the run's
data interval (never on the wall clock) and a retry repeats exactly the same work.
"""

from __future__ import annotations

from mlrelease_airflow.pod_spec import Resources, StepPod

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
}
