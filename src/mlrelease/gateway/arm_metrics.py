"""The guardrails' evidence as Prometheus series: each model call summed by assigned arm and by *analysis unit*.

The verdict engine judges arms by assignment and clusters every variance by user (rollout/windows.py). Prometheus
cannot hold a series per user, so users are grouped into `ANALYSIS_UNITS` units by their canary bucket, in contiguous
ranges (unit = bucket × units ÷ buckets). A unit is a cluster of whole users, so a variance clustered by unit is a valid
variance clustered by user (coarser, never finer). Contiguous ranges make every unit belong to one arm (a cohort's
candidate holds the buckets below its threshold), except the one unit the threshold cuts: so a unit's sums before the
rollout are the sums of the same users, and the comparison's covariate (each user's own pre-rollout level, CUPED) keeps
its power. Hashing users into units independently of the bucket would mix both arms' users in every unit and leave the
covariate little to explain (measured: `bench/bench_verdict_sim.py --analysis-units`). The sums:

- `…_unit_requests_total`, `…_unit_failed_total` (error, timeout, out of range), `…_unit_nan_total`,
  `…_unit_answers_total` and `…_unit_low_score_total` (answers with a score under LOW_CONFIDENCE): counts;
- `…_unit_log_latency_total`, `…_unit_log_prediction_total`, `…_unit_log_score_total`: sums of log(x) + LOG_OFFSET
  (x clipped at 1e-6, as rollout/windows.py does), so that they only grow, as a Prometheus counter must; the reader
  subtracts LOG_OFFSET × requests (or answers);
- `…_unit_latency_seconds`: a histogram on rollout/windows.py's LATENCY_BOUNDS_S, so the tail contract finds its
  bound exactly where the decision log would.

A retry (stable answering a candidate-assigned request whose candidate call failed) is not a request of its own and is
not counted here; a request stable's breaker rested (`unavailable`) made no model call and is not either. Both are in
`…_arm_calls_total` (no unit label: by outcome and retry), which the outage finder's per-second timeline reads.

Unlike the decision log, answers are not de-duplicated by request key (a replica cannot know another's): a repeated
request is counted each time. Repeats come from the same user, so they stay in one unit and the clustered variance
accounts for them; only the weighting of the answer contracts' means differs a little.
"""

from __future__ import annotations

import math
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from mlrelease.gateway.cohorts import BUCKETS
from mlrelease.rollout.windows import HARD_FAILURES, LATENCY_BOUNDS_S, LOW_CONFIDENCE, NAN, OK, OUTCOME_CODES

# Canary-bucket ranges per cohort. More units: a finer clustering (closer to per user), more clusters in a small arm
# (the last stage's 5 % control holds ~6 units per cohort) and more series: each unit has 8 counters and a 41-bound
# histogram, and it is in one arm at a time, so 128 units × 3 cohorts ≈ 20,000 series per model and replica (up to
# twice that once a rollout moved units from stable to the candidate). The reader takes whatever units it finds.
ANALYSIS_UNITS = 128
FLOOR = 1e-6  # what rollout/windows.py clips latencies, predictions and scores at before taking the log
LOG_OFFSET = -math.log(FLOOR)  # log(x) + LOG_OFFSET ≥ 0 for every clipped x
UNIT_PREFIX = "mlrelease_gateway_unit"
ARM_CALLS = "mlrelease_gateway_arm_calls"
UNIT_LABELS = ["model", "cohort", "assigned", "unit"]


def analysis_unit(bucket: int) -> int:
    """The analysis unit of a canary bucket: its contiguous range of BUCKETS ÷ ANALYSIS_UNITS buckets."""
    return bucket * ANALYSIS_UNITS // BUCKETS


def _positive_log(x: float) -> float:
    return math.log(max(x, FLOOR)) + LOG_OFFSET if math.isfinite(x) else 0.0


class ArmSeries:
    """The per-unit and per-outcome series of one gateway process (every served model's, by the `model` label)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def counter(name: str, help_text: str) -> Counter:
            return Counter(f"{UNIT_PREFIX}_{name}", help_text, UNIT_LABELS, registry=registry)

        self.requests = counter("requests", "Requests by assigned arm and analysis unit (retries not counted).")
        self.failed = counter("failed", "Requests whose model call failed (error, timeout, out of range).")
        self.nan = counter("nan", "Requests answered with NaN or infinity.")
        self.answers = counter("answers", "Requests answered by a model.")
        self.low_score = counter("low_score", f"Answers whose score is under {LOW_CONFIDENCE}.")
        self.log_latency = counter("log_latency", f"Σ log(latency s) + {LOG_OFFSET:.4f} over requests.")
        self.log_prediction = counter("log_prediction", f"Σ log(prediction) + {LOG_OFFSET:.4f} over answers.")
        self.log_score = counter("log_score", f"Σ log(score) + {LOG_OFFSET:.4f} over answers.")
        self.latency = Histogram(
            f"{UNIT_PREFIX}_latency_seconds",
            "Model-call latency of requests, by assigned arm and analysis unit.",
            UNIT_LABELS,
            buckets=tuple(float(b) for b in LATENCY_BOUNDS_S),
            registry=registry,
        )
        self.calls = Counter(
            ARM_CALLS,
            "Model calls (and requests stable's breaker rested: outcome unavailable) by assigned arm and outcome.",
            ["model", "cohort", "assigned", "outcome", "retry"],
            registry=registry,
        )


class ModelArms:
    """One served model's view of `ArmSeries`: `observe` records one model call (children resolved once each)."""

    def __init__(self, series: ArmSeries, model: str) -> None:
        self.series, self.model = series, model
        self._units: dict[tuple[str, int, int], tuple[Any, ...]] = {}
        self._calls: dict[tuple[str, int, str, bool], Any] = {}

    def observe(
        self,
        *,
        cohort: str,
        assigned: int,
        bucket: int,
        retry: bool,
        outcome: str,
        latency_s: float,
        prediction: float | None,
        score: float | None,
    ) -> None:
        """Record one model call of a request assigned to `assigned` whose user has canary `bucket` (see the module
        docstring for what counts)."""
        key = (cohort, assigned, outcome, retry)
        calls = self._calls.get(key)
        if calls is None:
            calls = self._calls[key] = self.series.calls.labels(self.model, cohort, str(assigned), outcome, str(retry))
        calls.inc()
        code = OUTCOME_CODES[outcome]
        if retry or outcome == "unavailable":
            return
        children = self._unit(cohort, assigned, analysis_unit(bucket))
        requests, failed, nan, answers, low, log_latency, log_prediction, log_score, latency = children
        requests.inc()
        log_latency.inc(_positive_log(latency_s))
        latency.observe(latency_s)
        if code in HARD_FAILURES:
            failed.inc()
        elif code == NAN:
            nan.inc()
        elif code == OK and prediction is not None and score is not None:
            answers.inc()
            log_prediction.inc(_positive_log(prediction))
            log_score.inc(_positive_log(score))
            if score < LOW_CONFIDENCE:
                low.inc()

    def _unit(self, cohort: str, assigned: int, unit: int) -> tuple[Any, ...]:
        key = (cohort, assigned, unit)
        children = self._units.get(key)
        if children is None:
            s, labels = self.series, (self.model, cohort, str(assigned), str(unit))
            children = self._units[key] = tuple(
                metric.labels(*labels)
                for metric in (
                    s.requests,
                    s.failed,
                    s.nan,
                    s.answers,
                    s.low_score,
                    s.log_latency,
                    s.log_prediction,
                    s.log_score,
                    s.latency,
                )
            )
        return children
