"""What a step's pod looks like, independent of where it runs: command, args, env, resources, placement.

Pure data: no Airflow or Kubernetes imports, so DAG parsing stays cheap and both runners share one spec.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from mlrelease.outcome import INTERVAL_END_ENV, RUN_ID_ENV, TASK_ID_ENV, TRY_NUMBER_ENV
from mlrelease.release_spec import MODEL_ENV
from mlrelease.stepdefs import Resources, StepDef

__all__ = ["OUTCOME_ENV", "ClusterSettings", "Resources", "StepPod"]

STATE_MOUNT = "/var/lib/mlrelease"
# The gateway ConfigMap (deploy/): steps read the same routing store, cohorts and, in httproute mode, route.
CONFIG_MOUNT = "/etc/mlrelease/gateway"
XCOM_PATH = "/airflow/xcom/return.json"
# Step-specific images, overridable by the named variable. The perf image is built FROM the Triton SDK
# image (nvcr.io/nvidia/tritonserver:<release>-py3-sdk, which ships perf_analyzer) plus the mlrelease package.
DEFAULT_IMAGES = {"MLRELEASE_K8S_PERF_IMAGE": "ghcr.io/mlrelease/perf:0.1.0"}
# Which task instance a step process is (mlrelease.outcome.StepRun), rendered by Airflow per task try like the
# arguments: with it the step records its own outcome under the run's artifacts, whichever runner started it.
# A run without a data interval (a manual run without a logical date) passes an empty end: nothing is recorded.
OUTCOME_ENV: tuple[tuple[str, str], ...] = (
    (TASK_ID_ENV, "{{ ti.task_id }}"),
    (RUN_ID_ENV, "{{ run_id }}"),
    (TRY_NUMBER_ENV, "{{ ti.try_number }}"),
    (
        INTERVAL_END_ENV,
        "{{ data_interval_end.isoformat() if data_interval_end is defined and data_interval_end else '' }}",
    ),
)


@dataclass(frozen=True)
class StepPod:
    """One step as a pod: `mlrelease step <step> <args...>` with its env and resources."""

    step: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    resources: Resources = field(default_factory=Resources)
    image_env: str | None = None  # variable naming a step-specific image (else the cluster's step image)
    routes_traffic: bool = False  # reads or moves the rollout's routing (the HTTPRoute router needs the API)
    # The model the step releases (MLRELEASE_MODEL of its process): its DAG's, or a template such as the
    # rollback form's `{{ params.model }}`. Empty only in the catalogue, before a DAG picks the model.
    model: str = ""

    @classmethod
    def of(cls, step: StepDef) -> StepPod:
        """The pod of a declared step, with the arguments a DAG task passes (Jinja templates)."""
        return cls(
            step.name,
            args=step.dag_args(),
            resources=step.resources,
            image_env=step.image_env,
            routes_traffic=step.routes_traffic,
        )

    @property
    def env_vars(self) -> dict[str, str]:
        """The container's templated environment on either runner: the outcome identity, the model, the step's own.

        The model is the DAG's (one nightly DAG per declared model), so every step process releases the DAG's model
        whatever the worker's own environment says; a pod without one is an error, never a guess.
        """
        if not self.model:
            raise ValueError(f"step {self.step}: no model given (a DAG's step_operator names the model it releases)")
        return {**dict(OUTCOME_ENV), MODEL_ENV: self.model, **dict(self.env)}

    @property
    def cmds(self) -> list[str]:
        """The container entrypoint."""
        return ["mlrelease", "step", self.step]

    @property
    def needs_gpu(self) -> bool:
        """Whether the pod must land on a GPU node."""
        return self.resources.gpus > 0


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def env_flag(name: str, *, default: bool) -> bool:
    """Boolean variable `name`: true/false, yes/no, on/off or 1/0; unset or blank: `default`; else an error."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ValueError(f"{name} must be one of {', '.join(TRUE_WORDS + FALSE_WORDS)}; got {value!r}")


@dataclass(frozen=True)
class ClusterSettings:
    """Where and as whom step pods run on Kubernetes; read from MLRELEASE_K8S_* variables."""

    image: str
    namespace: str
    service_account: str
    env_secret: str
    state_claim: str
    gpu_node_selector: tuple[tuple[str, str], ...]
    gpu_toleration_key: str
    run_as_user: int = 10001
    gateway_config_map: str = "mlrelease-gateway-config"
    traffic_router: str = "gateway"  # MLRELEASE_TRAFFIC_ROUTER: `httproute` routing steps talk to the Kubernetes API
    # MLRELEASE_METRICS_SOURCE (+ _PROMETHEUS_URL, _PROMETHEUS_SELECTOR): where analyze reads the guardrails' evidence
    metrics_source: str = "decision_log"
    prometheus_url: str = ""
    prometheus_selector: str = ""
    # MLRELEASE_K8S_DEFERRABLE: a running step waits in the triggerer, not in a worker slot (needs a triggerer).
    deferrable: bool = True
    # MLRELEASE_K8S_POD_TEMPLATE_FILE: a pod YAML the platform team owns (labels, tolerations, pull secrets…),
    # read by the worker when it builds the pod; the step's own settings win where both set a field.
    pod_template_file: str | None = None

    def image_for(self, pod: StepPod) -> str:
        """The pod's image: its own (e.g. the perf_analyzer image built on the Triton SDK) or the step image."""
        if pod.image_env:
            return os.environ.get(pod.image_env, DEFAULT_IMAGES[pod.image_env])
        return self.image

    @classmethod
    def from_env(cls) -> ClusterSettings:
        """Settings from the environment, with defaults that match deploy/."""
        get = os.environ.get
        selector = get("MLRELEASE_K8S_GPU_NODE_SELECTOR", "nvidia.com/gpu.present=true")
        pairs = tuple(tuple(item.split("=", 1)) for item in selector.split(",") if "=" in item)
        return cls(
            image=get("MLRELEASE_K8S_IMAGE", "ghcr.io/mlrelease/step:0.1.0"),
            namespace=get("MLRELEASE_K8S_NAMESPACE", "mlrelease"),
            service_account=get("MLRELEASE_K8S_SERVICE_ACCOUNT", "mlrelease-step"),
            env_secret=get("MLRELEASE_K8S_ENV_SECRET", "mlrelease-step-env"),
            state_claim=get("MLRELEASE_K8S_STATE_CLAIM", "mlrelease-state"),
            gpu_node_selector=pairs,  # type: ignore[arg-type]
            gpu_toleration_key=get("MLRELEASE_K8S_GPU_TOLERATION", "nvidia.com/gpu"),
            gateway_config_map=get("MLRELEASE_K8S_GATEWAY_CONFIGMAP", "mlrelease-gateway-config"),
            traffic_router=get("MLRELEASE_TRAFFIC_ROUTER", "gateway"),
            metrics_source=get("MLRELEASE_METRICS_SOURCE", "decision_log"),
            prometheus_url=get("MLRELEASE_PROMETHEUS_URL", ""),
            prometheus_selector=get("MLRELEASE_PROMETHEUS_SELECTOR", ""),
            deferrable=env_flag("MLRELEASE_K8S_DEFERRABLE", default=True),
            pod_template_file=get("MLRELEASE_K8S_POD_TEMPLATE_FILE", "").strip() or None,
        )

    def needs_api_token(self, pod: StepPod) -> bool:
        """Whether the pod needs its service-account token: only routing steps, and only with the HTTPRoute router."""
        return pod.routes_traffic and self.traffic_router == "httproute"
