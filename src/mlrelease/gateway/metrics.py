"""Prometheus metrics of one gateway process (own registry, so tests can run several apps in one process)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest, values

from mlrelease.gateway.arm_metrics import ArmSeries, ModelArms
from mlrelease.model.estimator import LOW_CONFIDENCE

# Every gateway process exports its own registry, so its samples live in its memory. `import feast` (feast.metrics)
# sets PROMETHEUS_MULTIPROC_DIR to a temp dir of its own when unset, and every process started by one that imported
# Feast inherits it: prometheus_client then stores each sample in an mmap file there (a lock, a pid check and a
# file write per increment: ~30 µs a request, a sixth of the gateway's own Python path), in a directory the parent
# deletes when it exits. prometheus_client picks the value class per metric and child from this module attribute.
values.ValueClass = values.MutexValue

PREFIX = "mlrelease_gateway"
LATENCY_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
CONFIDENCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, LOW_CONFIDENCE, 0.7, 0.8, 0.9, 0.95, 1.0)
ETA_BUCKETS = (4, 8, 12, 16, 20, 24, 30, 36, 48, 72, 96, 144, 240)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class GatewayMetrics:
    """Every metric one gateway process exports. Each model's series carry a `model` label first (a gateway may
    serve several models: a version number means nothing without its model); then cohort × version (version "none"
    for the fallback rule). Rejections come before a request's model is known and have no model label."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._models: dict[str, ModelMetrics] = {}
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests", "Answered predictions.", ["model", "cohort", "version", "source"], registry=r
        )
        self.rejections = Counter(f"{PREFIX}_rejections", "Requests refused, by reason.", ["reason"], registry=r)
        self.model_failures = Counter(
            f"{PREFIX}_model_failures",
            "Hard failures of a version (retried elsewhere).",
            ["model", "version", "kind"],
            registry=r,
        )
        self.latency = Histogram(
            f"{PREFIX}_request_latency_seconds",
            "End-to-end predict latency.",
            ["model", "cohort", "version"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.model_latency = Histogram(
            f"{PREFIX}_model_latency_seconds",
            "Triton call latency.",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_rows = Histogram(
            f"{PREFIX}_model_batch_rows",
            "Rows per Triton call the gateway sent (micro-batching).",
            ["model", "version", "role"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.feature_latency = Histogram(
            f"{PREFIX}_feature_latency_seconds",
            "Feast online lookup latency.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.confidence = Histogram(
            f"{PREFIX}_confidence",
            "The score output served (the release spec's score: a confidence or a probability).",
            ["model", "cohort", "version"],
            buckets=CONFIDENCE_BUCKETS,
            registry=r,
        )
        self.low_confidence = Counter(
            f"{PREFIX}_low_confidence",
            f"Predictions served with a score < {LOW_CONFIDENCE}.",
            ["model", "cohort", "version"],
            registry=r,
        )
        self.prediction = Histogram(
            f"{PREFIX}_eta_prediction_hours",
            "The prediction output served (the release spec's prediction).",
            ["model", "cohort", "version"],
            buckets=ETA_BUCKETS,
            registry=r,
        )
        self.breaker_state = Gauge(
            f"{PREFIX}_breaker_state",
            "Per-version breaker: 0 closed, 1 open, 2 half-open.",
            ["model", "version"],
            registry=r,
        )
        self.guard_trips = Counter(
            f"{PREFIX}_guard_trips", "Candidate versions tripped.", ["model", "version"], registry=r
        )
        self.routing_revision = Gauge(
            f"{PREFIX}_routing_revision", "Revision of the routing state in use.", ["model"], registry=r
        )
        self.routing_errors = Counter(
            f"{PREFIX}_routing_state_errors",
            "Routing state reads that failed (kept the last good).",
            ["model", "reason"],
            registry=r,
        )
        self.candidate_percent = Gauge(
            f"{PREFIX}_candidate_percent",
            "Share of a cohort's traffic routed to the candidate.",
            ["model", "cohort"],
            registry=r,
        )
        # Lets alerts and dashboards compare the candidate with stable by role, not by guessing from numbers.
        self.version_role = Gauge(
            f"{PREFIX}_version_role",
            "1 when the routing state gives the version this role (stable or candidate), else 0.",
            ["model", "version", "role"],
            registry=r,
        )
        self.arms = ArmSeries()  # the guardrails' evidence by assigned arm and analysis unit (arm_metrics.py)
        # process_start_time_seconds among them: a reader of counters tells a restarted replica by it (a restarted
        # counter that has already passed its old value shows no reset of its own)
        ProcessCollector(registry=r)

    def exposition(self) -> bytes:
        """Everything /metrics serves: the registry's series, then the arm series (rendered by arm_metrics itself)."""
        return generate_latest(self.registry) + self.arms.exposition()

    def for_model(self, model: str) -> ModelMetrics:
        """The series of one served model (its `model` label given), made once per model."""
        if model not in self._models:
            self._models[model] = ModelMetrics(self, model)
        return self._models[model]


class _Bound:
    """A metric with its `model` label given: `labels(...)` takes the labels after it."""

    __slots__ = ("_metric", "_model")

    def __init__(self, metric: Any, model: str) -> None:
        self._metric, self._model = metric, model

    def labels(self, *values: str) -> Any:
        """The child for `values` (the labels after `model`)."""
        return self._metric.labels(self._model, *values)


class ModelMetrics:
    """One served model's view of the gateway's metrics: the same names as GatewayMetrics, the model label bound.

    :param metrics: the process's metrics.
    :param model: the served model's name.
    """

    def __init__(self, metrics: GatewayMetrics, model: str) -> None:
        self.model = model
        self.registry = metrics.registry  # where the series live (the process's one registry)
        self.rejections = metrics.rejections
        self.requests = _Bound(metrics.requests, model)
        self.model_failures = _Bound(metrics.model_failures, model)
        self.latency = _Bound(metrics.latency, model)
        self.model_latency = _Bound(metrics.model_latency, model)
        self.batch_rows = _Bound(metrics.batch_rows, model)
        self.confidence = _Bound(metrics.confidence, model)
        self.low_confidence = _Bound(metrics.low_confidence, model)
        self.prediction = _Bound(metrics.prediction, model)
        self.breaker_state = _Bound(metrics.breaker_state, model)
        self.guard_trips = _Bound(metrics.guard_trips, model)
        self.routing_errors = _Bound(metrics.routing_errors, model)
        self.candidate_percent = _Bound(metrics.candidate_percent, model)
        self.version_role = _Bound(metrics.version_role, model)
        self.feature_latency = metrics.feature_latency.labels(model)
        self.routing_revision = metrics.routing_revision.labels(model)
        self.arms = ModelArms(metrics.arms, model)  # the guardrails' evidence, by assigned arm and analysis unit
        self._answer_children: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        self._batch_children: dict[tuple[int, str], Any] = {}

    def observe_answer(self, cohort: str, version: str, source: str, prediction: float, score: float, s: float) -> None:
        """Record one answered prediction."""
        key = (cohort, version, source)
        children = self._answer_children.get(key)
        if children is None:  # labels() costs a lock and a tuple build per call: resolve each series once
            children = self._answer_children[key] = (
                self.requests.labels(cohort, version, source),
                self.latency.labels(cohort, version),
                self.confidence.labels(cohort, version),
                self.prediction.labels(cohort, version),
                self.low_confidence.labels(cohort, version),
            )
        requests, latency, score_hist, prediction_hist, low = children
        requests.inc()
        latency.observe(s)
        score_hist.observe(score)
        prediction_hist.observe(prediction)
        if score < LOW_CONFIDENCE:
            low.inc()

    def observe_batch(self, version: int, role: str, rows: int) -> None:
        """Record the size of one Triton call the micro-batcher sent."""
        child = self._batch_children.get((version, role))
        if child is None:
            child = self._batch_children[version, role] = self.batch_rows.labels(str(version), role)
        child.observe(rows)
