"""The values that `deploy/values.yaml` holds: strict, frozen pydantic models, validated before anything renders.

Field names are the YAML keys (camelCase, as in Helm values), so an error's location is the YAML path:
`gateway.autoscaling: Value error, minReplicas (5) is above maxReplicas (3)`. Defaults equal the names the
DAG's pod builder uses (`plugins/mlrelease_airflow/pod_spec.py`, `ClusterSettings.from_env()`), so a cluster
rendered from defaults is the cluster the DAG expects.
"""

from __future__ import annotations

import ipaddress
import math
import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from mlrelease.deploy.quantity import check_quantity, parse_quantity
from mlrelease.release_spec import load_specs
from mlrelease.yamlconfig import load_yaml_model

# RFC 1123 label: what Kubernetes requires of namespace, service account, secret, claim and service names.
Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)]
Port = Annotated[int, Field(ge=1, le=65535)]
Quantity = Annotated[str, AfterValidator(check_quantity)]
ResourceName = Literal["cpu", "memory", "ephemeral-storage"]
# An HTTP header name (RFC 9110 token).
HeaderName = Annotated[str, StringConstraints(pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")]
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# Step pods carry app.kubernetes.io/name=mlrelease (plugins/mlrelease_airflow/kubernetes.py); NetworkPolicies
# select them by it, so no other workload may use that name.
STEP_POD_NAME = "mlrelease"


class Model(BaseModel):
    """Frozen, and an unknown key is an error: a typo must fail the render, not vanish."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Image(Model):
    """A container image by repository and an immutable tag (never `latest`)."""

    repository: str = Field(min_length=1)
    tag: str
    pullPolicy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"

    @field_validator("repository")
    @classmethod
    def _repository(cls, value: str) -> str:
        if "@" in value or ":" in value.rsplit("/", 1)[-1]:
            raise ValueError(f"repository {value!r} must not carry a tag or digest; put the tag in `tag`")
        return value

    @field_validator("tag")
    @classmethod
    def _tag(cls, value: str) -> str:
        if value == "latest":
            raise ValueError("tag 'latest' is mutable: pin a release tag so every node runs the same image")
        if not _TAG.match(value):
            raise ValueError(f"{value!r} is not a valid image tag")
        return value

    @property
    def reference(self) -> str:
        """`repository:tag`."""
        return f"{self.repository}:{self.tag}"


class Resources(Model):
    """Requests and limits in Kubernetes quantities; a memory limit is required, requests never exceed limits."""

    requests: dict[ResourceName, Quantity] = {}
    limits: dict[ResourceName, Quantity] = {}

    @model_validator(mode="after")
    def _check(self) -> Resources:
        if "memory" not in self.limits:
            raise ValueError("limits.memory is required: a pod without one can take a node's memory from others")
        for name, request in self.requests.items():
            limit = self.limits.get(name)
            if limit is not None and parse_quantity(request) > parse_quantity(limit):
                raise ValueError(f"requests.{name} ({request}) is above limits.{name} ({limit})")
        return self


class Probe(Model):
    """Probe timing (the endpoint is fixed by the workload)."""

    periodSeconds: int = Field(10, ge=1, le=300)
    timeoutSeconds: int = Field(2, ge=1)
    failureThreshold: int = Field(3, ge=1)
    initialDelaySeconds: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> Probe:
        if self.timeoutSeconds > self.periodSeconds:
            raise ValueError(f"timeoutSeconds ({self.timeoutSeconds}) is above periodSeconds ({self.periodSeconds})")
        return self


class StartupProbe(Model):
    """Startup probe timing; failureThreshold defaults to what the start-up budget needs."""

    periodSeconds: int = Field(10, ge=1, le=300)
    timeoutSeconds: int = Field(2, ge=1)
    failureThreshold: int | None = Field(None, ge=1)

    def threshold(self, budget_s: int) -> int:
        """Failures allowed: the configured number, else enough periods to cover `budget_s`."""
        return self.failureThreshold or math.ceil(budget_s / self.periodSeconds)


class Probes(Model):
    """Startup, readiness and liveness timing of one workload."""

    startup: StartupProbe = StartupProbe()
    readiness: Probe = Probe()
    liveness: Probe = Probe()

    def check_budget(self, budget_s: int, budget_field: str) -> None:
        """Fail when the startup probe would give up (and the pod restart) before `budget_s` has passed."""
        allowed = self.startup.threshold(budget_s) * self.startup.periodSeconds
        if allowed < budget_s:
            raise ValueError(
                f"probes.startup allows {allowed}s (failureThreshold × periodSeconds) but {budget_field} is "
                f"{budget_s}s: the pod would be restarted before it can finish starting"
            )


class Autoscaling(Model):
    """A HorizontalPodAutoscaler on CPU utilisation."""

    enabled: bool = True
    minReplicas: int = Field(3, ge=1)
    maxReplicas: int = Field(10, ge=1)
    targetCPUUtilizationPercentage: int = Field(70, ge=1, le=100)

    @model_validator(mode="after")
    def _check(self) -> Autoscaling:
        if self.minReplicas > self.maxReplicas:
            raise ValueError(f"minReplicas ({self.minReplicas}) is above maxReplicas ({self.maxReplicas})")
        return self


class DisruptionBudget(Model):
    """A PodDisruptionBudget: at most `maxUnavailable` pods evicted at once (drains, upgrades)."""

    enabled: bool = True
    maxUnavailable: int = Field(1, ge=1)


class Peer(Model):
    """Who is on the other side of an allowed connection: pods by labels (in a namespace) or IP ranges."""

    namespace: Name | None = Field(None, description="None: the release namespace")
    podLabels: dict[str, str] = {}
    cidrs: tuple[str, ...] = ()
    ports: tuple[Port, ...] = ()

    @field_validator("cidrs")
    @classmethod
    def _cidrs(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        for value in values:
            try:
                ipaddress.ip_network(value, strict=True)
            except ValueError as exc:
                raise ValueError(f"{value!r} is not a CIDR block: {exc}") from None
        return values

    @model_validator(mode="after")
    def _check(self) -> Peer:
        if self.cidrs and (self.podLabels or self.namespace):
            raise ValueError("give either cidrs or namespace/podLabels, not both")
        if not self.cidrs and not self.podLabels and self.namespace is None:
            raise ValueError("give cidrs, podLabels or a namespace: an empty peer would allow every pod")
        return self


class Steps(Model):
    """The DAG's step pods (KubernetesPodOperator): their identity and env, as the DAG names them."""

    serviceAccount: Name = "mlrelease-step"
    envSecret: Name = "mlrelease-step-env"


class State(Model):
    """The state volume (MLRELEASE_HOME) shared by step pods, gateway replicas and Triton."""

    claimName: Name = "mlrelease-state"
    create: bool = True
    size: Quantity = "100Gi"
    storageClassName: str | None = None
    # Step pods, gateway replicas and Triton mount it from different nodes at once.
    accessMode: Literal["ReadWriteMany"] = "ReadWriteMany"


class Gpu(Model):
    """Where GPU pods go: the node selector and the taint they tolerate."""

    nodeSelector: dict[str, str] = {"nvidia.com/gpu.present": "true"}
    tolerationKey: str = "nvidia.com/gpu"


class Airflow(Model):
    """The Airflow release whose workers launch the step pods."""

    namespace: Name = "airflow"
    serviceAccounts: tuple[Name, ...] = Field(("airflow-worker",), min_length=1)


class ParentGateway(Model):
    """The Gateway API Gateway the HTTPRoute attaches to."""

    name: Name = "inference"
    namespace: Name | None = None
    sectionName: Name | None = None


class HttpRoute(Model):
    """The HTTPRoute the rollout patches in `httproute` mode (the route object itself is rendered elsewhere)."""

    name: Name = "parcel-eta"
    namespace: Name | None = Field(None, description="None: the release namespace")
    parentGateway: ParentGateway = ParentGateway()
    cohortHeader: HeaderName = "x-mlrelease-cohort"
    backends: Literal["triton", "gateways"] = Field(
        "triton",
        description="triton: weighted backends straight to Triton (no stage can open: nothing observes them); "
        "gateways: the route assigns users by bucketHeader to one gateway Deployment per arm (observed, guarded)",
    )
    bucketHeader: HeaderName = "x-mlrelease-bucket"
    hostnames: tuple[str, ...] = ()
    initialStableVersion: int = Field(1, ge=1, description="the version the route serves when first created")
    acceptTimeoutSeconds: float = Field(60, ge=0, description="wait this long for the controller to accept a change")


class Routing(Model):
    """How traffic is split: the gateway's own routing state in Redis, or a Gateway API HTTPRoute."""

    mode: Literal["gateway", "httproute"] = "gateway"
    stateUrl: str = "redis://mlrelease-redis.mlrelease.svc:6379/0"
    httpRoute: HttpRoute = HttpRoute()

    @field_validator("stateUrl")
    @classmethod
    def _state_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("redis", "rediss") or not parts.hostname:
            raise ValueError(f"{value!r} is not a redis:// or rediss:// URL with a host")
        if parts.password:
            raise ValueError("the URL carries a password; it would land in a ConfigMap: use a Redis without one")
        return value


class Gateway(Model):
    """The prediction gateway: image, scale, probes, and where its config and secrets come from."""

    name: Name = "mlrelease-gateway"
    serviceAccount: Name = "mlrelease-gateway"
    image: Image = Image(repository="ghcr.io/mlrelease/gateway", tag="0.1.0")
    port: Port = 8080
    workers: int = Field(1, ge=1)
    replicas: int = Field(3, ge=1)
    autoscaling: Autoscaling = Autoscaling()
    podDisruptionBudget: DisruptionBudget = DisruptionBudget()
    resources: Resources = Resources(requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "2", "memory": "2Gi"})
    startupBudgetSeconds: int = Field(60, ge=1)
    probes: Probes = Probes(startup=StartupProbe(periodSeconds=5))
    configFile: str = "../config/gateway.yaml"
    configMap: Name = "mlrelease-gateway-config"
    keysSecret: Name = "mlrelease-gateway-keys"
    envSecret: Name = "mlrelease-gateway-env"

    @property
    def fewest_replicas(self) -> int:
        """The smallest replica count the Deployment can have (the HPA's floor when it scales)."""
        return self.autoscaling.minReplicas if self.autoscaling.enabled else self.replicas

    @model_validator(mode="after")
    def _check(self) -> Gateway:
        pdb = self.podDisruptionBudget
        if pdb.enabled and self.fewest_replicas < 2:
            raise ValueError(
                f"podDisruptionBudget needs at least 2 replicas (has {self.fewest_replicas}): with one, "
                "a drain either evicts the only pod or is blocked for ever"
            )
        if pdb.enabled and pdb.maxUnavailable >= self.fewest_replicas:
            raise ValueError(
                f"podDisruptionBudget.maxUnavailable ({pdb.maxUnavailable}) must be below the replica count "
                f"({self.fewest_replicas}), or a drain can take every pod at once"
            )
        if self.workers != 1:
            # each uvicorn worker keeps its own metrics and a scrape of the pod reads one of them at random, so every
            # counter would jump between workers for the alerts, the dashboard and the prometheus metrics source
            raise ValueError(
                f"workers must be 1 (got {self.workers}): each worker keeps its own /metrics and a scrape reads one "
                "at random; scale with replicas (the HPA) instead"
            )
        if self.autoscaling.enabled and "cpu" not in self.resources.requests:
            raise ValueError("autoscaling on CPU utilisation needs resources.requests.cpu")
        self.probes.check_budget(self.startupBudgetSeconds, "startupBudgetSeconds")
        return self


class TritonPorts(Model):
    """Triton's HTTP, gRPC and metrics ports."""

    http: Port = 8000
    grpc: Port = 8001
    metrics: Port = 8002

    @model_validator(mode="after")
    def _distinct(self) -> TritonPorts:
        if len({self.http, self.grpc, self.metrics}) != 3:
            raise ValueError("http, grpc and metrics must be three different ports")
        return self


class Triton(Model):
    """The Triton server on a GPU node: explicit model control over the model repository on the state volume."""

    name: Name = "triton"
    serviceAccount: Name = "mlrelease-triton"
    image: Image = Image(repository="ghcr.io/mlrelease/triton", tag="0.1.0")
    runAsUser: int = Field(1000, ge=1, description="the NGC image's triton-server user; fsGroup stays the shared one")
    replicas: int = Field(1, ge=1)
    gpus: int = Field(1, ge=1)
    resources: Resources = Resources(requests={"cpu": "2", "memory": "8Gi"}, limits={"cpu": "4", "memory": "16Gi"})
    ports: TritonPorts = TritonPorts()
    modelRepositorySubPath: str = Field("model_repository", pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")
    # One Triton serves every declared model (explicit model control loads these at start).
    loadModels: tuple[str, ...] = Field(default_factory=lambda: tuple(sorted(load_specs())))
    modelLoadBudgetSeconds: int = Field(600, ge=1)
    strictReadiness: bool = False
    shmSize: Quantity = "1Gi"
    probes: Probes = Probes()

    @model_validator(mode="after")
    def _check(self) -> Triton:
        if self.replicas != 1:
            raise ValueError(
                f"replicas is {self.replicas}: explicit model control is per server and the steps load and "
                "unload through one Service, so a second replica would serve a different set of versions"
            )
        self.probes.check_budget(self.modelLoadBudgetSeconds, "modelLoadBudgetSeconds")
        return self


def _dns() -> Peer:
    return Peer(namespace="kube-system", podLabels={"k8s-app": "kube-dns"}, ports=(53,))


class Network(Model):
    """The peers the NetworkPolicies allow; everything else is denied."""

    dns: Peer = Field(default_factory=_dns)
    gatewayClients: tuple[Peer, ...] = Field(
        (Peer(namespace="ingress-nginx", podLabels={"app.kubernetes.io/name": "ingress-nginx"}),), min_length=1
    )
    prometheus: Peer = Peer(namespace="monitoring", podLabels={"app.kubernetes.io/name": "prometheus"})
    redis: Peer = Peer(podLabels={"app.kubernetes.io/name": "redis"}, ports=(6379,))
    feastOnlineStore: Peer = Peer(podLabels={"app.kubernetes.io/name": "redis"}, ports=(6379,))
    # The Postgres of Feast's SQL registry (feature_repo/feature_store.production.yaml), read by steps and gateway.
    feastRegistry: Peer = Peer(namespace="postgres", podLabels={"app.kubernetes.io/name": "postgresql"}, ports=(5432,))
    mlflow: Peer = Peer(namespace="mlflow", podLabels={"app.kubernetes.io/name": "mlflow"}, ports=(5000,))
    pushgateway: Peer | None = None
    kubernetesApi: Peer | None = None
    routeDataPlane: Peer | None = None

    @model_validator(mode="after")
    def _ports(self) -> Network:
        for name in ("dns", "redis", "feastOnlineStore", "feastRegistry", "mlflow", "pushgateway", "kubernetesApi"):
            peer = getattr(self, name)
            if peer is not None and not peer.ports:
                raise ValueError(f"{name}.ports is empty: say which ports the connection uses")
        return self


class Monitoring(Model):
    """Prometheus Operator objects, and where the rollout steps read their evidence.

    PodMonitors scrape every gateway and Triton pod on its own (a scrape through a Service reads one replica at
    random, and every counter would jump between replicas); the PrometheusRule carries
    deploy/monitoring/prometheus/alerts.yaml. `metricsSource: prometheus` makes the rollout steps judge from
    Prometheus (MLRELEASE_METRICS_SOURCE in the Airflow values must say the same) and lets them reach it.
    """

    podMonitors: bool = True
    prometheusRule: bool = True
    scrapeInterval: Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]*(ms|s|m)$")] = "15s"
    labels: dict[str, str] = Field(
        default_factory=lambda: {"release": "kube-prometheus-stack"},
        description="labels your Prometheus' podMonitorSelector and ruleSelector match",
    )
    metricsSource: Literal["decision_log", "prometheus"] = "decision_log"
    prometheusUrl: str = "http://prometheus-operated.monitoring.svc:9090"
    prometheusPort: Port = 9090

    @field_validator("prometheusUrl")
    @classmethod
    def _url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http:// or https:// URL with a host")
        return value


class DeployValues(Model):
    """Everything `mlrelease deploy render` needs."""

    namespace: Name = "mlrelease"
    podSecurity: Literal["restricted", "baseline"] = "restricted"
    runAsUser: int = Field(10001, ge=1)
    steps: Steps = Steps()
    state: State = State()
    gpu: Gpu = Gpu()
    airflow: Airflow = Airflow()
    routing: Routing = Routing()
    gateway: Gateway = Gateway()
    triton: Triton = Triton()
    network: Network = Network()
    monitoring: Monitoring = Monitoring()

    @property
    def route_namespace(self) -> str:
        """Namespace of the HTTPRoute the rollout patches."""
        return self.routing.httpRoute.namespace or self.namespace

    @model_validator(mode="after")
    def _check(self) -> DeployValues:
        api = self.network.kubernetesApi
        if self.routing.mode == "httproute" and (api is None or not api.cidrs):
            raise ValueError(
                "routing.mode httproute: step pods patch the HTTPRoute through the API server, so "
                "network.kubernetesApi needs its cidrs and ports"
            )
        if self.routing.httpRoute.namespace not in (None, self.namespace):
            # The route's backendRefs name the Triton Service without a namespace (a cross-namespace
            # backend needs a ReferenceGrant the release does not render).
            raise ValueError(
                f"routing.httpRoute.namespace {self.routing.httpRoute.namespace!r} must be the release namespace "
                f"{self.namespace!r} (or null), where the Triton Service it routes to lives"
            )
        if self.routing.mode == "httproute" and self.network.routeDataPlane is None:
            raise ValueError(
                "routing.mode httproute: the Gateway API data plane sends traffic to Triton (or to the arm gateways), "
                "so network.routeDataPlane must name its pods"
            )
        for name, workload in (("gateway", self.gateway.name), ("triton", self.triton.name)):
            if workload == STEP_POD_NAME:
                raise ValueError(f"{name}.name {workload!r} is the step pods' app name, which NetworkPolicies select")
        accounts = [self.steps.serviceAccount, self.gateway.serviceAccount, self.triton.serviceAccount]
        if len(set(accounts)) != 3:
            raise ValueError(f"steps, gateway and triton need three different service accounts, got {accounts}")
        return self


def load_values(path: str | Path) -> DeployValues:
    """Read and validate a values file; a StepError lists every problem with its YAML path."""
    return load_yaml_model(Path(path), DeployValues, "deploy values")
