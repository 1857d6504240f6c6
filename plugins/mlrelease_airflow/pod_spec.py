"""What a step's pod looks like, independent of where it runs: command, args, env, resources, placement.

Pure data: no Airflow or Kubernetes imports, so DAG parsing stays cheap and both runners share one spec.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

STATE_MOUNT = "/var/lib/mlrelease"
# The gateway ConfigMap (deploy/): steps read the same routing store, cohorts and, in httproute mode, route.
CONFIG_MOUNT = "/etc/mlrelease/gateway"
XCOM_PATH = "/airflow/xcom/return.json"
# Step-specific images, overridable by the named variable. The perf image is built FROM the Triton SDK
# image (nvcr.io/nvidia/tritonserver:<release>-py3-sdk, which ships perf_analyzer) plus the mlrelease package.
DEFAULT_IMAGES = {"MLRELEASE_K8S_PERF_IMAGE": "ghcr.io/mlrelease/perf:0.1.0"}


@dataclass(frozen=True)
class Resources:
    """CPU and memory requests/limits in Kubernetes quantity notation, plus GPUs."""

    cpu: str = "500m"
    memory: str = "1Gi"
    cpu_limit: str = "2"
    memory_limit: str = "2Gi"
    gpus: int = 0


@dataclass(frozen=True)
class StepPod:
    """One step as a pod: `mlrelease step <step> <args...>` with its env and resources."""

    step: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    resources: Resources = field(default_factory=Resources)
    image_env: str | None = None  # variable naming a step-specific image (else the cluster's step image)
    routes_traffic: bool = False  # reads or moves the rollout's routing (the HTTPRoute router needs the API)

    @property
    def cmds(self) -> list[str]:
        """The container entrypoint."""
        return ["mlrelease", "step", self.step]

    @property
    def needs_gpu(self) -> bool:
        """Whether the pod must land on a GPU node."""
        return self.resources.gpus > 0


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
        )

    def needs_api_token(self, pod: StepPod) -> bool:
        """Whether the pod needs its service-account token: only routing steps, and only with the HTTPRoute router."""
        return pod.routes_traffic and self.traffic_router == "httproute"
