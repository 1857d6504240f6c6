"""Prometheus metrics of one gateway process (own registry, so tests can run several apps in one process)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values

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
    """Every metric the gateway exports; labels are cohort × version (version "none" for the fallback rule)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._answer_children: dict[tuple[str, str, str], tuple[Any, ...]] = {}
        self._batch_children: dict[tuple[int, str], Any] = {}
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests", "Answered predictions.", ["cohort", "version", "source"], registry=r
        )
        self.rejections = Counter(f"{PREFIX}_rejections", "Requests refused, by reason.", ["reason"], registry=r)
        self.model_failures = Counter(
            f"{PREFIX}_model_failures",
            "Hard failures of a version (retried elsewhere).",
            ["version", "kind"],
            registry=r,
        )
        self.latency = Histogram(
            f"{PREFIX}_request_latency_seconds",
            "End-to-end predict latency.",
            ["cohort", "version"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.model_latency = Histogram(
            f"{PREFIX}_model_latency_seconds", "Triton call latency.", ["version"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_rows = Histogram(
            f"{PREFIX}_model_batch_rows",
            "Rows per Triton call the gateway sent (micro-batching).",
            ["version", "role"],
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.feature_latency = Histogram(
            f"{PREFIX}_feature_latency_seconds", "Feast online lookup latency.", buckets=LATENCY_BUCKETS, registry=r
        )
        self.confidence = Histogram(
            f"{PREFIX}_confidence",
            "confidence_score served.",
            ["cohort", "version"],
            buckets=CONFIDENCE_BUCKETS,
            registry=r,
        )
        self.low_confidence = Counter(
            f"{PREFIX}_low_confidence",
            f"Predictions served with confidence_score < {LOW_CONFIDENCE}.",
            ["cohort", "version"],
            registry=r,
        )
        self.prediction = Histogram(
            f"{PREFIX}_eta_prediction_hours",
            "eta_prediction served.",
            ["cohort", "version"],
            buckets=ETA_BUCKETS,
            registry=r,
        )
        self.breaker_state = Gauge(
            f"{PREFIX}_breaker_state", "Per-version breaker: 0 closed, 1 open, 2 half-open.", ["version"], registry=r
        )
        self.guard_trips = Counter(f"{PREFIX}_guard_trips", "Candidate versions tripped.", ["version"], registry=r)
        self.routing_revision = Gauge(f"{PREFIX}_routing_revision", "Revision of the routing state in use.", registry=r)
        self.routing_errors = Counter(
            f"{PREFIX}_routing_state_errors",
            "Routing state reads that failed (kept the last good).",
            ["reason"],
            registry=r,
        )
        self.candidate_percent = Gauge(
            f"{PREFIX}_candidate_percent",
            "Share of a cohort's traffic routed to the candidate.",
            ["cohort"],
            registry=r,
        )
        # Lets alerts and dashboards compare the candidate with stable by role, not by guessing from numbers.
        self.version_role = Gauge(
            f"{PREFIX}_version_role",
            "1 when the routing state gives the version this role (stable or candidate), else 0.",
            ["version", "role"],
            registry=r,
        )

    def observe_answer(self, cohort: str, version: str, source: str, eta: float, confidence: float, s: float) -> None:
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
        requests, latency, confidence_hist, prediction, low = children
        requests.inc()
        latency.observe(s)
        confidence_hist.observe(confidence)
        prediction.observe(eta)
        if confidence < LOW_CONFIDENCE:
            low.inc()

    def observe_batch(self, version: int, role: str, rows: int) -> None:
        """Record the size of one Triton call the micro-batcher sent."""
        child = self._batch_children.get((version, role))
        if child is None:
            child = self._batch_children[version, role] = self.batch_rows.labels(str(version), role)
        child.observe(rows)
